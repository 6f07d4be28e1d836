"""Tensor bytes of ``ModelInfer`` / ``ModelStreamInfer`` on the wire without protobuf's copies.

Through protobuf, a 64 MB raw input was copied twice after grpc handed over the received bytes
(parsed into the message, then again into a ``bytes`` on access), and a raw output four times
(``bytes(view)``, appended into the message, serialized, handed to grpc). Here:

- ``parse_infer_request``: a request of ``SPLIT_BYTES`` or more is scanned field by field at its
  top level; each ``raw_input_contents`` entry becomes a view of the received bytes (no copy) and
  only the other fields (names, shapes, parameters: small) go through protobuf. A smaller request
  is parsed whole, as before (the scan would cost more than the copies it saves). A request the
  scan cannot read is parsed whole too, so malformed input fails as protobuf fails.
- ``serialize_infer_response``: the answer's fields except the raw outputs are serialized by
  protobuf; the raw outputs are appended as wire fields (a repeated field may come in any number
  of pieces, in order), so the output's bytes are copied once, from the worker's segment into the
  message grpc sends.

The byte layouts are protobuf's (tag = field number << 3 | wire type, base-128 varints). Both
functions are pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from tritonclient.grpc import service_pb2 as pb

SPLIT_BYTES: Final = 64 * 1024  # requests at least this large have their raw inputs split out
RAW_INPUT_FIELD: Final = 7  # ModelInferRequest.raw_input_contents
RAW_OUTPUT_FIELD: Final = 6  # ModelInferResponse.raw_output_contents
STREAM_INFER_RESPONSE_FIELD: Final = 2  # ModelStreamInferResponse.infer_response
_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5


@dataclass(frozen=True, slots=True)
class InferRequestWire:
    """A received ModelInferRequest: ``message`` with every field but ``raw_input_contents``
    when ``raw`` holds them (views of the received bytes, in order); ``raw`` is valid as long as
    this object is referenced."""

    message: Any  # pb.ModelInferRequest
    raw: Sequence[memoryview]


def wire_request(message: Any) -> InferRequestWire:
    """A parsed ModelInferRequest (all fields in the message) as an ``InferRequestWire``."""
    return InferRequestWire(message, [memoryview(raw) for raw in message.raw_input_contents])


def parse_infer_request(data: bytes) -> InferRequestWire:
    """The request deserializer of ModelInfer and ModelStreamInfer."""
    if len(data) >= SPLIT_BYTES:
        split = _split_raw_inputs(data)
        if split is not None:
            rest, raw = split
            return InferRequestWire(pb.ModelInferRequest.FromString(rest), raw)
    return wire_request(pb.ModelInferRequest.FromString(data))


def _split_raw_inputs(data: bytes) -> tuple[bytes, list[memoryview]] | None:
    """(the bytes of every other field, the raw inputs' views); None when the top level is not
    well-formed (protobuf's parse then says why)."""
    view = memoryview(data)
    raw: list[memoryview] = []
    rest: list[memoryview] = []
    position, end = 0, len(data)
    while position < end:
        start = position
        tag, position = _read_varint(data, position)
        if position < 0:
            return None
        wire_type = tag & 7
        if wire_type == _LEN:
            length, position = _read_varint(data, position)
            if position < 0 or position + length > end:
                return None
            if tag >> 3 == RAW_INPUT_FIELD:
                raw.append(view[position:position + length])
            else:
                rest.append(view[start:position + length])
            position += length
            continue
        if wire_type == _VARINT:
            _, position = _read_varint(data, position)
        elif wire_type == _FIXED64:
            position += 8
        elif wire_type == _FIXED32:
            position += 4
        else:  # groups: not in this message
            return None
        if position < 0 or position > end:
            return None
        rest.append(view[start:position])
    return b"".join(rest), raw


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    """(value, position after it); position -1 when the varint runs past the end or past 10
    bytes."""
    value = shift = 0
    end = len(data)
    while position < end and shift < 70:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
    return 0, -1


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_prefix(field: int, length: int) -> bytes:
    return encode_varint(field << 3 | _LEN) + encode_varint(length)


def serialize_infer_response(head: Any, raw: Sequence[bytes | memoryview], *,
                             stream: bool = False) -> bytes:
    """``head`` (a ModelInferResponse without raw outputs) with ``raw`` as its
    ``raw_output_contents``, serialized; ``stream``: wrapped as a ModelStreamInferResponse's
    ``infer_response``. ``raw`` is copied once, here."""
    pieces: list[bytes | memoryview] = [head.SerializeToString()]
    for contents in raw:
        pieces.append(_len_prefix(RAW_OUTPUT_FIELD, len(contents)))
        pieces.append(contents)
    if stream:
        inner_length = sum(len(piece) for piece in pieces)
        pieces.insert(0, _len_prefix(STREAM_INFER_RESPONSE_FIELD, inner_length))
    return b"".join(pieces)


def serialize_message(message: bytes | Any) -> bytes:
    """Response serializer of ModelInfer and ModelStreamInfer: bytes from
    ``serialize_infer_response`` as they are, a protobuf message (an in-band error) serialized."""
    if isinstance(message, bytes):
        return message
    return message.SerializeToString()  # type: ignore[no-any-return]
