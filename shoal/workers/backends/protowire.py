"""Reading protobuf messages straight from their wire format, for the broker's auto-complete: it
needs a few fields of a model file (an ONNX graph's inputs, a SavedModel's signatures), so it
neither imports the model's runtime nor needs the runtime's generated message classes.

Contract: every function takes one message's bytes as a ``memoryview`` and returns values or
views into it (never copies of length-delimited fields). Malformed input raises ``Malformed``
(or ``IndexError`` when a varint runs past the end): callers turn either into their own
"cannot be parsed" error. Groups (wire types 3 and 4) are not used by ONNX or TensorFlow
protos and are refused as malformed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

VARINT: Final = 0
FIXED64: Final = 1
BYTES: Final = 2
FIXED32: Final = 5


class Malformed(Exception):
    """The bytes are not a protobuf message (of the expected shape)."""


def fields(data: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of each field of one message: an int for varints and
    fixed-size fields, a view (no copy) for length-delimited ones."""
    position, end = 0, len(data)
    while position < end:
        key, position = varint(data, position)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise Malformed
        if wire == VARINT:
            value, position = varint(data, position)
            yield number, wire, value
        elif wire == BYTES:
            length, position = varint(data, position)
            if position + length > end:
                raise Malformed
            yield number, wire, data[position:position + length]
            position += length
        elif wire in (FIXED64, FIXED32):
            width = 8 if wire == FIXED64 else 4
            if position + width > end:
                raise Malformed
            yield number, wire, int.from_bytes(data[position:position + width], "little")
            position += width
        else:
            raise Malformed


def varint(data: memoryview, position: int) -> tuple[int, int]:
    """(value, next position) of the varint at ``position``; a value of 2**63 or more is read as
    the negative int64 it encodes (e.g. a dim of -1)."""
    result, shift = 0, 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift > 63:
            raise Malformed
    if result >= 1 << 63:
        result -= 1 << 64
    return result, position


def messages(data: memoryview, field: int) -> list[memoryview]:
    """Every length-delimited value of field ``field`` (views, no copies)."""
    return [value for number, _, value in fields(data)
            if number == field and isinstance(value, memoryview)]


def ints(data: memoryview, field: int) -> list[int]:
    """Every varint or fixed-size value of field ``field``."""
    return [value for number, _, value in fields(data)
            if number == field and isinstance(value, int)]


def text(values: list[memoryview]) -> str:
    """The last of a string field's values (protobuf: the last one wins), "" when none."""
    return bytes(values[-1]).decode("utf-8", "replace") if values else ""
