from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shoal.dtypes import DATATYPES, numpy_dtype
from shoal.errors import ErrorCode, ShoalError
from shoal.shm.tensors import (
    array_from_buffer,
    array_to_bytes,
    tensor_nbytes,
    wire_nbytes,
    write_array,
)

FIXED = [d for d in DATATYPES if d != "BYTES"]


def _sample(datatype: str, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    count = int(np.prod(shape))
    if datatype == "BOOL":
        flags: np.ndarray[Any, Any] = np.arange(count) % 3 == 0
        return flags.reshape(shape)
    if datatype == "BF16":
        return np.arange(0x3F80, 0x3F80 + count, dtype=np.uint16).reshape(shape)
    dtype = numpy_dtype(datatype)
    values: np.ndarray[Any, Any] = np.arange(count) * (-1 if dtype.kind in "if" else 1)
    return values.astype(dtype).reshape(shape)


@pytest.mark.parametrize("datatype", FIXED)
def test_fixed_round_trip_through_shared_layout(datatype: str) -> None:
    shape = (2, 3, 4)
    array = _sample(datatype, shape)
    nbytes = tensor_nbytes(datatype, shape)
    assert nbytes == 24 * numpy_dtype(datatype).itemsize == wire_nbytes(array, datatype)
    buffer = bytearray(nbytes + 16)
    assert write_array(memoryview(buffer), array, datatype) == nbytes
    assert bytes(buffer[:nbytes]) == array_to_bytes(array, datatype)
    # the bytes are little-endian, row-major
    assert bytes(buffer[:nbytes]) == array.astype(numpy_dtype(datatype)).tobytes()
    restored = array_from_buffer(memoryview(buffer)[:nbytes], datatype, shape)
    assert restored.shape == shape
    np.testing.assert_array_equal(restored, array)


def test_array_from_buffer_is_zero_copy() -> None:
    buffer = bytearray(16)
    array = array_from_buffer(memoryview(buffer), "FP32", [2, 2])
    buffer[0:4] = np.float32(2.5).tobytes()
    assert array[0, 0] == 2.5


def test_bf16_is_a_uint16_view_and_floats_are_converted() -> None:
    data = array_to_bytes(np.array([1.0, -2.5, 3.140625], dtype=np.float32), "BF16")
    restored = array_from_buffer(memoryview(data), "BF16", [3])
    assert restored.dtype == np.uint16
    as_float = (restored.astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(as_float, [1.0, -2.5, 3.140625])


def test_bytes_round_trip_with_framing() -> None:
    array = np.array([[b"a", b""], [b"\x00z\x00", "h\u00e9".encode()]], dtype=np.object_)
    wire = array_to_bytes(array, "BYTES")
    assert wire[:5] == b"\x01\x00\x00\x00a"
    assert wire_nbytes(array, "BYTES") == len(wire) == 4 * 4 + 1 + 0 + 3 + 3
    buffer = bytearray(len(wire) + 8)
    assert write_array(memoryview(buffer), array, "BYTES") == len(wire)
    restored = array_from_buffer(memoryview(buffer)[:len(wire)], "BYTES", [2, 2])
    assert restored.dtype == np.object_ and restored.tolist() == array.tolist()


def test_bytes_from_str_and_lists_keep_trailing_nuls() -> None:
    assert wire_nbytes(["h\u00e9"], "BYTES") == 4 + 3
    wire = array_to_bytes([b"ab\x00\x00", "c"], "BYTES")
    assert array_from_buffer(memoryview(wire), "BYTES", [2]).tolist() == [b"ab\x00\x00", b"c"]


def test_values_are_cast_to_the_datatype() -> None:
    wire = array_to_bytes([[1, 2], [3, 4]], "INT32")
    assert wire == np.array([1, 2, 3, 4], dtype="<i4").tobytes()
    buffer = bytearray(4)
    assert write_array(memoryview(buffer), np.array([0, 5, 0, -1]), "BOOL") == 4
    assert bytes(buffer) == b"\x00\x01\x00\x01"
    big_endian = np.array([1, 2], dtype=">i4")
    assert array_to_bytes(big_endian, "INT32") == b"\x01\x00\x00\x00\x02\x00\x00\x00"


def test_non_contiguous_input_is_written_row_major() -> None:
    array = np.arange(6, dtype=np.int16).reshape(2, 3).T
    buffer = bytearray(12)
    write_array(memoryview(buffer), array, "INT16")
    assert np.frombuffer(buffer, dtype="<i2").tolist() == [0, 3, 1, 4, 2, 5]


def test_size_mismatch_and_bad_shapes_are_invalid_arg() -> None:
    for call in (
        lambda: array_from_buffer(memoryview(bytearray(15)), "FP32", [2, 2]),
        lambda: array_from_buffer(memoryview(bytearray(8)), "FP32", [-1, 2]),
        lambda: tensor_nbytes("FP32", [2, -3]),
        lambda: tensor_nbytes("BYTES", [2]),
        lambda: tensor_nbytes("FP128", [2]),
        lambda: array_from_buffer(memoryview(b"\x01\x00\x00\x00a"), "BYTES", [2]),
    ):
        with pytest.raises(ShoalError) as info:
            call()
        assert info.value.code == ErrorCode.INVALID_ARG


def test_write_into_too_small_destination_raises_value_error() -> None:
    with pytest.raises(ValueError):
        write_array(memoryview(bytearray(15)), np.zeros(4, np.float32), "FP32")
    with pytest.raises(ValueError):
        write_array(memoryview(bytearray(5)), np.array([b"abc"], dtype=np.object_), "BYTES")


def test_empty_tensors() -> None:
    assert tensor_nbytes("FP32", [0, 5]) == 0
    assert array_from_buffer(memoryview(b""), "FP32", [0, 5]).shape == (0, 5)
    assert array_from_buffer(memoryview(b""), "BYTES", [0]).shape == (0,)
    assert write_array(memoryview(bytearray(0)), np.zeros((0, 3), np.int8), "INT8") == 0


def test_write_array_refuses_an_unknown_datatype_for_a_float64_array() -> None:
    # numpy's ``dtype == None`` is True for float64: the memcpy path must not take it as known
    with pytest.raises(ShoalError, match="FP128"):
        write_array(memoryview(bytearray(64)), np.arange(4, dtype=np.float64), "FP128")
