"""The datatype table: wire names (KServe v2), config enum names, numpy and torch dtypes, and the
BYTES element framing (4-byte little-endian length, then the bytes; no padding).

Contract: every tensor in shared memory is little-endian, row-major, unpadded. BOOL is one byte.
BF16 has no numpy dtype; it is carried as raw ``uint16`` bit patterns (numpy side) and viewed as
``torch.bfloat16`` by torch backends.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Final

import numpy as np
import numpy.typing as npt

from shoal.errors import ErrorCode, ShoalError, invalid_arg

DATATYPES: Final = (
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES", "BF16",
)

# wire name -> numpy dtype (little-endian). BYTES -> object; BF16 -> uint16 bit patterns.
_NUMPY: Final[dict[str, np.dtype[np.generic]]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(np.object_),
    "BF16": np.dtype("<u2"),
}

# the fixed-size datatypes' numpy dtypes (every datatype but BYTES)
FIXED_NUMPY: Final[dict[str, np.dtype[np.generic]]] = {
    k: v for k, v in _NUMPY.items() if k != "BYTES"
}

# element size in bytes; BYTES has none (variable)
_ELEMENT_SIZE: Final[dict[str, int]] = {k: v.itemsize for k, v in FIXED_NUMPY.items()}


def is_datatype(name: str) -> bool:
    return name in _NUMPY


def element_size(datatype: str) -> int:
    """Bytes per element; raises KeyError for BYTES (variable size) or unknown types."""
    return _ELEMENT_SIZE[datatype]


def numpy_dtype(datatype: str) -> np.dtype[np.generic]:
    return _NUMPY[datatype]


def config_to_wire(config_type: str) -> str:
    """'TYPE_FP32' -> 'FP32'; 'TYPE_STRING' -> 'BYTES'."""
    if config_type == "TYPE_STRING":
        return "BYTES"
    if not config_type.startswith("TYPE_") or config_type[5:] not in _NUMPY:
        raise invalid_arg(f"unknown data_type '{config_type}'")
    return config_type[5:]


def wire_to_config(datatype: str) -> str:
    """'FP32' -> 'TYPE_FP32'; 'BYTES' -> 'TYPE_STRING'."""
    if datatype == "BYTES":
        return "TYPE_STRING"
    if datatype not in _NUMPY:
        raise invalid_arg(f"unknown datatype '{datatype}'")
    return "TYPE_" + datatype


def numpy_to_wire(dtype: npt.DTypeLike) -> str:
    """numpy dtype -> wire name. Strings / bytes / object arrays are BYTES. (uint16 maps to UINT16,
    never BF16: BF16 cannot be inferred from a numpy dtype.)"""
    dt = np.dtype(dtype)
    if dt.kind in ("O", "S", "U"):
        return "BYTES"
    if dt == np.bool_:
        return "BOOL"
    for name, candidate in _NUMPY.items():
        if name in ("BYTES", "BF16"):
            continue
        if candidate == dt.newbyteorder("<"):
            return name
    raise invalid_arg(f"numpy dtype {dt} has no Triton datatype")


def torch_dtype(datatype: str) -> object:
    """wire name -> torch dtype (imports torch lazily; BYTES has none)."""
    import torch

    table: dict[str, torch.dtype] = {
        "BOOL": torch.bool, "UINT8": torch.uint8, "UINT16": torch.uint16,
        "UINT32": torch.uint32, "UINT64": torch.uint64, "INT8": torch.int8,
        "INT16": torch.int16, "INT32": torch.int32, "INT64": torch.int64,
        "FP16": torch.float16, "FP32": torch.float32, "FP64": torch.float64,
        "BF16": torch.bfloat16,
    }
    return table[datatype]


_LEN = struct.Struct("<I")


def bytes_element(item: object) -> bytes:
    """One BYTES element's bytes: bytes as they are, str in UTF-8, anything else with a string
    form of its own as that text (Triton's ``serialize_byte_tensor``: numbers become their
    text). An element whose only string form is ``object``'s default (``<X object at
    0x7f...>``) is INTERNAL: it would send a memory address to the client."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, bytearray | memoryview):
        return bytes(item)
    if isinstance(item, str):
        return item.encode("utf-8")
    kind = type(item)
    if kind.__str__ is object.__str__ and kind.__repr__ is object.__repr__:
        raise ShoalError(ErrorCode.INTERNAL, (
            f"a BYTES element of type '{kind.__name__}' has no string form of its own (its "
            "default one would send a memory address); give bytes, str or numbers"))
    return str(item).encode("utf-8")


def serialize_bytes(items: Iterable[object]) -> bytes:
    """Elements (``bytes_element`` each, in row-major order) -> BYTES wire framing."""
    parts: list[bytes] = []
    for item in items:
        data = bytes_element(item)
        parts.append(_LEN.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def serialize_bytes_array(array: npt.NDArray[np.generic]) -> bytes:
    return serialize_bytes(array.reshape(-1).tolist() if array.dtype != np.object_
                           else array.reshape(-1))


def deserialize_bytes(buffer: bytes | memoryview, count: int | None = None) -> list[bytes]:
    """BYTES wire framing -> list of elements. With ``count``, exactly that many elements must be
    present and the buffer must end right after the last one (else INVALID_ARG)."""
    view = memoryview(buffer).cast("B")
    out: list[bytes] = []
    pos = 0
    end = len(view)
    while pos < end:
        if end - pos < 4:
            raise invalid_arg("incomplete string length indicator in BYTES data")
        (length,) = _LEN.unpack_from(view, pos)
        pos += 4
        if length > end - pos:
            raise invalid_arg("BYTES element length exceeds the remaining data")
        out.append(bytes(view[pos:pos + length]))
        pos += length
        if count is not None and len(out) > count:
            raise invalid_arg(f"unexpected number of string elements, expected {count}")
    if count is not None and len(out) != count:
        raise invalid_arg(f"expected {count} string elements, got {len(out)}")
    return out


def bytes_to_object_array(buffer: bytes | memoryview, shape: list[int]) -> npt.NDArray[np.object_]:
    count = 1
    for d in shape:
        count *= d
    items = deserialize_bytes(buffer, count)
    arr = np.empty(count, dtype=np.object_)
    arr[:] = items
    return arr.reshape(shape)


def element_count(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
