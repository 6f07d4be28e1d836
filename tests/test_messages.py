"""Every cross-process message round-trips through its [kind, body] frames."""

from __future__ import annotations

import msgspec
import pytest

from shoal.errors import ErrorCode
from shoal.messages import (
    Batch,
    BatchResult,
    BatchTimings,
    Error,
    InferRequest,
    InferResponse,
    Lease,
    MsgKind,
    ReleaseLeases,
    RequestedOutput,
    Result,
    StreamResponse,
    StreamResponses,
    TensorRef,
    UnknownMessage,
    WorkerReady,
    WorkerRequest,
    decode,
    encode,
)

REF = TensorRef("INPUT0", "FP32", [2, 4], "/shoal-abcdefabcdef-fe1-0", 128, 32)
MESSAGES = [
    InferRequest(7, "m", 1, [REF], [RequestedOutput("Y", {"binary_data": True})],
                 {"custom": "x", "n": 3, "f": 0.5, "b": True}, "client-id", 2, 1, 1000, "seq", 3),
    InferResponse(7, 1, [REF], {}, None, Lease("m:1:m_0:1", 9)),
    InferResponse(8, error=Error(ErrorCode.UNAVAILABLE, "Exceeds maximum queue size")),
    ReleaseLeases([Lease("w", 1), Lease("w", 2)]),
    Batch(3, [WorkerRequest(7, [REF], batch_size=2)]),
    BatchResult(3, [Result(7, [REF]), Result(8, error=Error(ErrorCode.INTERNAL, "boom"))],
                BatchTimings(1, 2, 3), Lease("w", 4)),
    WorkerReady("w", 1234),
    StreamResponses([StreamResponse(5, [TensorRef("text_output", "BYTES", [1], "", 0, 7,
                                                  inline=b"\x03\x00\x00\x00 w1")]),
                     StreamResponse(6, final=True, empty=True)]),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(message: object) -> None:
    frames = encode(message)  # type: ignore[arg-type]
    assert len(frames) == 2 and len(frames[0]) == 1
    assert decode(frames) == message


def test_kind_bytes_are_unique() -> None:
    values = [k.value for k in MsgKind]
    assert len(values) == len(set(values))


def test_router_identity_frames_are_ignored() -> None:
    frames = [b"identity", *encode(WorkerReady("w", 1))]
    assert decode(frames) == WorkerReady("w", 1)


@pytest.mark.parametrize("frames", [[b"\x7f", b"\x90"], [b"\x01", b"not msgpack"], [b"\x01"]])
def test_garbage_is_unknown_message(frames: list[bytes]) -> None:
    with pytest.raises(UnknownMessage):
        decode(frames)


def test_structs_are_frozen() -> None:
    with pytest.raises(AttributeError):
        REF.offset = 0  # type: ignore[misc]
    assert msgspec.structs.replace(REF, offset=0).offset == 0
