"""JSON ``data`` of an input -> the tensor's wire bytes (pure).

``data`` may be flat or nested (row-major; ragged nesting is flattened as Triton counts leaves);
the element count must match the shape (for BYTES the request's validation counts them, as
Triton's core does). Values must fit the datatype: integers in range for
integer types (no silent wrap-around), numbers for floats (not true/false), true/false for BOOL,
strings for BYTES (UTF-8, 4-byte-length framing). FP16 / BF16 cannot come as JSON (Triton's
rule). A value of the wrong JSON type gets Triton's text (``json_type_error``; Triton answers
them 500, shoal 400: the client's mistake); an integer out of the datatype's range, which Triton
silently wraps, is refused with the input's name and the range.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from shoal import dtypes
from shoal.errors import ShoalError, invalid_arg

_LENGTH = struct.Struct("<I")


def json_type_error(datatype: str) -> ShoalError:
    """Triton's error for JSON data of the wrong type for ``datatype`` (its TritonJson texts,
    which clients match on)."""
    if datatype == "BYTES":
        return invalid_arg("Unable to parse JSON bytes array: attempt to access JSON non-string "
                           "as string")
    if datatype == "BOOL":
        wanted = "non-boolean as boolean"
    elif dtypes.numpy_dtype(datatype).kind == "i":
        wanted = "non-signed-integer as signed-integer"
    elif dtypes.numpy_dtype(datatype).kind == "u":
        wanted = "non-unsigned-integer as unsigned-integer"
    else:
        wanted = "non-number as double"
    return invalid_arg(f"Unable to parse 'data': attempt to access JSON {wanted}")


def may_hold_booleans(text: bytes | bytearray) -> bool:
    """False only when the JSON ``text`` cannot hold a true / false: in UTF-8 the literals are
    these bytes; any other encoding the JSON parser accepts (UTF-16, UTF-32) has NUL bytes."""
    return b"\x00" in text or _holds_word(text, b"true") or _holds_word(text, b"false")


def _holds_word(text: bytes | bytearray, word: bytes) -> bool:
    """``word in text``, found from the occurrences of its first byte (memchr): numbers hold no
    ``t`` or ``f``, so a request of numbers has only its keys' few; CPython's substring search
    took 4 µs a word on a 5 KB body of floats (this: under 1)."""
    find, first, size = text.find, word[:1], len(word)
    at = find(first)
    while at != -1:
        if text[at:at + size] == word:
            return True
        at = find(first, at + 1)
    return False


def json_tensor_bytes(data: Any, datatype: str, count: int, name: str,
                      booleans: bool = True) -> memoryview:
    """JSON ``data`` (flat or nested, row-major) -> the tensor's wire bytes. The number of
    elements must equal ``count``; values must fit ``datatype`` (no silent wrap-around).
    ``booleans`` False: the request's JSON holds no true / false (``may_hold_booleans``), so
    numbers need no search for one among them."""
    if datatype in ("FP16", "BF16"):
        raise invalid_arg(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data "
            f"format for input {name}"
        )
    if not isinstance(data, list):
        raise invalid_arg("Unable to parse 'data': attempt to access JSON non-array as array")
    if datatype == "BYTES":
        return memoryview(_json_bytes(data, count, name))
    array = _json_numeric(data, datatype, count, name, booleans)
    return memoryview(array.view(np.uint8))  # type: ignore[arg-type]


def flatten(data: list[Any]) -> list[Any]:
    """``data``'s elements, nested arrays (lists) flattened, row-major; anything else (an
    object: a dict, or generate's ``JsonMembers``) is one element."""
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _json_numeric(data: list[Any], datatype: str, count: int, name: str,
                  booleans: bool) -> np.ndarray[Any, Any]:
    try:
        array = np.asarray(data)
    except (ValueError, TypeError, OverflowError):
        array = np.asarray(flatten(data))  # ragged nesting: Triton counts the leaves
    if array.size != count:
        raise invalid_arg(
            f"Unable to parse 'data' for input '{name}': expected {count} elements to match "
            f"'shape', got {array.size}"
        )
    target = dtypes.numpy_dtype(datatype)
    if target.kind in "iu" and array.dtype.kind in "fO":
        exact = _exact_integers(data, target)  # ints beyond int64 mixed with others
        if exact is not None:
            array = exact
    if array.size:
        _check_json_values(data, array, datatype, target, name, booleans)
    if target.kind != "f":
        return np.ascontiguousarray(array.reshape(-1), dtype=target)
    with np.errstate(over="ignore"):  # a float beyond FP16/FP32 becomes inf, as Triton's C cast
        return np.ascontiguousarray(array.reshape(-1), dtype=target)


def _exact_integers(data: list[Any], target: np.dtype[Any]) -> np.ndarray[Any, Any] | None:
    """numpy turns [-1, 2**64 - 1] into float64 (or object): when every element is a Python int
    that fits ``target``, convert exactly; otherwise None (the value check then reports)."""
    values = flatten(data)
    if not all(type(v) is int for v in values):
        return None
    info = np.iinfo(target)
    if values and (min(values) < info.min or max(values) > info.max):
        return None
    return np.array(values, dtype=target)


def _check_json_values(
    data: list[Any], array: np.ndarray[Any, Any], datatype: str, target: np.dtype[Any],
    name: str, booleans: bool
) -> None:
    kind = array.dtype.kind
    if datatype == "BOOL":
        accepted = kind == "b"
    elif target.kind in "iu":
        accepted = kind in "iu"
    else:
        accepted = kind in "iuf"
    if accepted and datatype != "BOOL" and booleans and _holds_a_bool(data):
        accepted = False  # numpy took true/false as 1/0 among numbers
    if not accepted:
        raise json_type_error(datatype)
    if target.kind in "iu":
        info = np.iinfo(target)
        if int(array.min()) < info.min or int(array.max()) > info.max:
            raise invalid_arg(
                f"Unable to parse 'data' for input '{name}': expected integer in "
                f"[{info.min}, {info.max}] values for datatype {datatype}"
            )


def _holds_a_bool(data: list[Any]) -> bool:
    """Any true/false among ``data``'s elements, nested or not (C-speed scans of their
    types)."""
    types = set(map(type, data))
    if list in types:
        types = set(map(type, flatten(data)))
    return bool in types


def _json_bytes(data: list[Any], count: int, name: str) -> bytes:
    """Framed strings. Their number is not checked against ``count`` here: Triton's core does
    it (``validation.check_bytes_framing``, "expected N string elements ...")."""
    flat = data if all(isinstance(s, str) for s in data) else flatten(data)
    parts: list[bytes] = []
    pack = _LENGTH.pack
    for element in flat:
        if not isinstance(element, str):
            raise json_type_error("BYTES")
        encoded = element.encode("utf-8", "surrogatepass")
        parts.append(pack(len(encoded)))
        parts.append(encoded)
    return b"".join(parts)
