"""numpy arrays <-> tensor bytes as they lie in shared memory and on the wire.

Layout contract (shoal/dtypes.py): little-endian, row-major, unpadded; BOOL is one byte; BF16 is
carried as uint16 bit patterns; BYTES elements use the 4-byte little-endian length framing.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shoal import dtypes
from shoal.errors import invalid_arg

_LENGTH = struct.Struct("<I")

# an ndarray, or anything numpy accepts; BYTES tensors also take sequences of bytes/str
TensorData = npt.ArrayLike | Sequence[object]


def tensor_nbytes(datatype: str, shape: Sequence[int]) -> int:
    """Bytes of a fixed-size tensor. INVALID_ARG for BYTES, unknown types, negative dims."""
    if datatype == "BYTES":
        raise invalid_arg("datatype BYTES has no fixed byte size")
    if not dtypes.is_datatype(datatype):
        raise invalid_arg(f"unknown datatype '{datatype}'")
    return _element_count(shape) * dtypes.element_size(datatype)


def array_from_buffer(buf: memoryview, datatype: str, shape: Sequence[int]) -> npt.NDArray[
        np.generic]:
    """The tensor in ``buf`` as an ndarray: a zero-copy view for fixed-size types (BF16 -> uint16
    bit patterns; read-only if ``buf`` is), an object array of ``bytes`` for BYTES. INVALID_ARG
    when ``buf`` does not hold exactly that tensor."""
    dims = list(map(int, shape))
    if datatype == "BYTES":
        _element_count(dims)
        return dtypes.bytes_to_object_array(buf, dims)
    dtype = dtypes.FIXED_NUMPY.get(datatype)
    if dtype is not None and buf.nbytes == math.prod(dims) * dtype.itemsize and min(
            dims, default=0) >= 0:  # the common case, checked without tensor_nbytes' calls
        return np.frombuffer(buf, dtype=dtype).reshape(dims)
    expected = tensor_nbytes(datatype, dims)
    if buf.nbytes != expected:
        raise invalid_arg(
            f"tensor of datatype {datatype} and shape {dims} needs {expected} bytes, "
            f"got {buf.nbytes}"
        )
    return np.frombuffer(buf, dtype=dtypes.numpy_dtype(datatype)).reshape(dims)


def wire_nbytes(array: TensorData, datatype: str) -> int:
    """Bytes ``array`` takes as a tensor of ``datatype`` (BYTES: 4-byte length per element plus
    the element bytes; str elements count as UTF-8)."""
    if datatype != "BYTES":
        size = array.size if type(array) is np.ndarray else np.asarray(array).size
        return int(size) * _fixed_element_size(datatype)
    return sum(4 + len(_encode_element(item)) for item in _bytes_elements(array))


def write_array(dest: memoryview, array: TensorData, datatype: str) -> int:
    """Copy ``array`` into the start of ``dest`` as a tensor of ``datatype`` (cast if its dtype
    differs) and return the bytes written. Fixed-size types are one ``np.copyto`` into an ndarray
    view of ``dest`` (a plain memcpy when ``array`` is a C-contiguous ndarray of the datatype's
    dtype). ValueError if ``dest`` is too small."""
    if datatype == "BYTES":
        return _write_bytes_elements(dest, _bytes_elements(array))
    fixed = dtypes.FIXED_NUMPY.get(datatype)  # None: unknown (and dtype == None means float64)
    if (fixed is not None and type(array) is np.ndarray and array.size
            and array.flags.c_contiguous and array.dtype == fixed
            and dest.format == "B" and dest.ndim == 1 and dest.c_contiguous and not dest.readonly):
        # already the tensor's bytes: one memcpy (a fraction of np.copyto's setup per call)
        nbytes = array.nbytes
        if nbytes > dest.nbytes:
            raise ValueError(f"destination holds {dest.nbytes} bytes, the tensor needs {nbytes}")
        dest[:nbytes] = array.data.cast("B")
        return nbytes
    source = _fixed_source(array, datatype)
    target_dtype = dtypes.numpy_dtype(datatype)
    nbytes = source.size * target_dtype.itemsize
    if nbytes > dest.nbytes:
        raise ValueError(f"destination holds {dest.nbytes} bytes, the tensor needs {nbytes}")
    target = np.frombuffer(dest, dtype=target_dtype, count=source.size).reshape(source.shape)
    np.copyto(target, source, casting="unsafe")
    return nbytes


def array_to_bytes(array: TensorData, datatype: str) -> bytes:
    """The tensor bytes of ``array`` (a new bytes object; for small tensors)."""
    if datatype == "BYTES":
        return dtypes.serialize_bytes(_bytes_elements(array))
    source = _fixed_source(array, datatype)
    return np.ascontiguousarray(source, dtype=dtypes.numpy_dtype(datatype)).tobytes()


def float_to_bf16_bits(array: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """float values -> bfloat16 bit patterns (round to nearest even; NaN stays NaN)."""
    bits = np.ascontiguousarray(array, dtype="<f4").view("<u4")
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    rounded: npt.NDArray[np.uint16] = ((bits + rounding) >> 16).astype("<u2")
    nan = np.isnan(bits.view("<f4"))
    if nan.any():
        rounded[nan] = ((bits[nan] >> 16) | 0x0040).astype("<u2")  # keep sign, quiet NaN
    return rounded


def _element_count(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        if dim < 0:
            raise invalid_arg(f"shape {list(shape)} has a negative dimension")
        count *= int(dim)
    return count


def _fixed_element_size(datatype: str) -> int:
    if not dtypes.is_datatype(datatype) or datatype == "BYTES":
        raise invalid_arg(f"unknown datatype '{datatype}'")
    return dtypes.element_size(datatype)


def _fixed_source(array: TensorData, datatype: str) -> npt.NDArray[np.generic]:
    """``array`` as an ndarray ready to cast into ``datatype`` (floats for BF16 become bits)."""
    _fixed_element_size(datatype)
    source = np.asarray(array)
    if datatype == "BF16" and source.dtype.kind == "f":
        return float_to_bf16_bits(source)
    return source


def _bytes_elements(array: TensorData) -> list[object]:
    """Row-major elements of a BYTES tensor. Lists go through an object array so that bytes
    with trailing NULs are not truncated by numpy's 'S' dtype."""
    if isinstance(array, np.ndarray):
        if array.dtype == np.object_:
            return list(array.reshape(-1))
        flat: list[object] = array.reshape(-1).tolist()
        return flat
    if isinstance(array, bytes | bytearray | str):
        return [array]
    return list(np.array(array, dtype=np.object_).reshape(-1))


def _write_bytes_elements(dest: memoryview, elements: list[object]) -> int:
    encoded = [_encode_element(item) for item in elements]
    total = sum(4 + len(data) for data in encoded)
    if total > dest.nbytes:
        raise ValueError(f"destination holds {dest.nbytes} bytes, the tensor needs {total}")
    target = dest.cast("B") if dest.format != "B" else dest
    position = 0
    for data in encoded:
        _LENGTH.pack_into(target, position, len(data))
        position += 4
        target[position:position + len(data)] = data
        position += len(data)
    return total


_encode_element = dtypes.bytes_element
