"""BLS answers as arrays over shared memory: zero-copy views that hold the answer's lease until
the last view is gone."""

from __future__ import annotations

import gc
import struct

import numpy as np

from shoal.errors import ErrorCode
from shoal.messages import Error, InferResponse, Lease, TensorRef
from shoal.workers.bls.memory import LeaseToken, SharedOutput, answer_from

LEASE = Lease("callee:1:m_0:3", 7)


class Memory:
    """Stands in for the callees' segments: one bytearray per region name."""

    def __init__(self) -> None:
        self.regions: dict[str, bytearray] = {}
        self.released: list[Lease] = []

    def put(self, region: str, data: bytes) -> None:
        self.regions[region] = bytearray(data)

    def view_of(self, ref: TensorRef) -> memoryview:
        return memoryview(self.regions[ref.region])[ref.offset:ref.offset + ref.nbytes]


def _fp32_response(memory: Memory, values: list[float], **kw: object) -> InferResponse:
    data = np.array(values, np.float32).tobytes()
    memory.put("/r0", b"\0" * 64 + data)
    ref = TensorRef("OUT", "FP32", [len(values)], "/r0", 64, len(data))
    return InferResponse(1, outputs=[ref], lease=LEASE, **kw)  # type: ignore[arg-type]


def test_token_releases_once_when_garbage() -> None:
    released: list[Lease] = []
    token = LeaseToken(LEASE, released.append)
    token.release_now()
    token.release_now()
    del token
    gc.collect()
    assert released == [LEASE]
    other = LeaseToken(LEASE, released.append)
    del other
    assert released == [LEASE, LEASE]


def test_outputs_are_views_that_hold_the_lease_until_the_last_view_dies() -> None:
    memory = Memory()
    answer = answer_from(_fp32_response(memory, [1, 2, 3, 4]), memory.view_of,
                         memory.released.append)
    array = answer.outputs[0].array
    assert array.tolist() == [1, 2, 3, 4] and not array.flags.owndata
    assert isinstance(array.base, SharedOutput)
    memory.regions["/r0"][64:68] = struct.pack("<f", 9.0)  # the same bytes, no copy
    assert array[0] == 9.0
    tail = array[2:]
    del answer, array
    gc.collect()
    assert memory.released == []  # the slice still reads the callee's memory
    assert tail.tolist() == [3, 4]
    del tail
    assert memory.released == [LEASE]


def test_bytes_outputs_are_decoded_and_hold_nothing() -> None:
    memory = Memory()
    data = b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b"", b"xyz"))
    memory.put("/r1", data)
    ref = TensorRef("S", "BYTES", [3], "/r1", 0, len(data))
    answer = answer_from(InferResponse(1, outputs=[ref], lease=LEASE), memory.view_of,
                         memory.released.append)
    assert answer.outputs[0].array.tolist() == [b"ab", b"", b"xyz"]
    assert memory.released == [LEASE]  # nothing views the memory: given back at once


def test_typed_outputs_keep_their_wire_types() -> None:
    memory = Memory()
    memory.put("/r2", np.array([True, False], np.bool_).tobytes()
               + b"\0" * 62 + np.array([0x3F80], np.uint16).tobytes())
    refs = [TensorRef("B", "BOOL", [2], "/r2", 0, 2), TensorRef("H", "BF16", [1], "/r2", 64, 2),
            TensorRef("E", "FP32", [0, 3], "/r2", 0, 0)]
    answer = answer_from(InferResponse(1, outputs=refs, lease=LEASE), memory.view_of,
                         memory.released.append)
    by_name = {o.name: o for o in answer.outputs}
    assert by_name["B"].array.tolist() == [True, False]
    assert by_name["H"].array.dtype == np.uint16 and by_name["H"].datatype == "BF16"
    assert by_name["E"].array.shape == (0, 3)


def test_failed_answers_give_the_memory_back_at_once() -> None:
    memory = Memory()
    error = Error(ErrorCode.INTERNAL, "callee failed")
    answer = answer_from(InferResponse(1, error=error, lease=LEASE), memory.view_of,
                         memory.released.append)
    assert answer.error == error and answer.outputs == [] and memory.released == [LEASE]


def test_an_output_that_does_not_match_its_shape_is_an_error() -> None:
    memory = Memory()
    memory.put("/r3", b"\0" * 8)
    ref = TensorRef("OUT", "FP32", [4], "/r3", 0, 8)
    answer = answer_from(InferResponse(1, outputs=[ref], lease=LEASE, final=False),
                         memory.view_of, memory.released.append)
    assert answer.error is not None and "needs 16" in answer.error.message
    assert answer.final is False
    assert memory.released == [LEASE]


def test_outputs_of_at_least_copy_bytes_are_copied_and_the_lease_given_back_at_once() -> None:
    memory = Memory()
    answer = answer_from(_fp32_response(memory, [1, 2, 3, 4]), memory.view_of,
                         memory.released.append, copy_bytes=16)
    array = answer.outputs[0].array
    assert array.tolist() == [1, 2, 3, 4] and array.flags.owndata
    assert memory.released == [LEASE]  # the callee may reuse the memory while array lives
    small = answer_from(_fp32_response(memory, [1, 2, 3, 4]), memory.view_of,
                        memory.released.append, copy_bytes=17)
    assert isinstance(small.outputs[0].array.base, SharedOutput)
    assert memory.released == [LEASE]
