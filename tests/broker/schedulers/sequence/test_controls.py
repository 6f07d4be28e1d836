from __future__ import annotations

import numpy as np
import pytest

from shoal.broker.schedulers.sequence import (
    BoolControl,
    ControlInputs,
    CorridControl,
    RowControl,
    build_control_tensors,
)
from shoal.broker.schedulers.sequence.controls import NOT_READY, corrid_integer

from .helpers import END, START, START_END, request

START_ROW = RowControl.for_request(request(1, 7, START))
CONTINUE_ROW = RowControl.for_request(request(2, 8))
END_ROW = RowControl.for_request(request(3, 9, END))
START_END_ROW = RowControl.for_request(request(4, 10, START_END))
ALL_ROWS = [START_ROW, CONTINUE_ROW, END_ROW, START_END_ROW, NOT_READY]


def controls(data_type: str, false: float | bool, true: float | bool) -> ControlInputs:
    return ControlInputs(
        start=BoolControl("S", data_type, false, true),
        end=BoolControl("E", data_type, false, true),
        ready=BoolControl("R", data_type, false, true),
    )


@pytest.mark.parametrize(
    ("data_type", "false", "true", "dtype"),
    [("INT32", 5, 9, np.int32), ("FP32", -1.5, 2.5, np.float32), ("BOOL", False, True, np.bool_)],
)
def test_each_flag_takes_the_configured_false_and_true_values(
    data_type: str, false: float | bool, true: float | bool, dtype: type[np.generic]
) -> None:
    tensors = build_control_tensors(controls(data_type, false, true), ALL_ROWS, batching=True)
    assert set(tensors) == {"S", "E", "R"}
    expected = {  # rows: start, continue, end, start+end, not ready
        "S": [true, false, false, true, false],
        "E": [false, false, true, true, false],
        "R": [true, true, true, true, false],
    }
    for name, values in expected.items():
        assert tensors[name].dtype == np.dtype(dtype)
        assert tensors[name].shape == (5, 1)
        np.testing.assert_array_equal(tensors[name][:, 0], np.array(values, dtype=dtype))


def test_a_model_without_batching_gets_shape_1() -> None:
    tensors = build_control_tensors(controls("INT32", 0, 1), [END_ROW], batching=False)
    assert tensors["E"].shape == (1,)
    assert tensors["E"].tolist() == [1]
    with pytest.raises(ValueError, match="one row"):
        build_control_tensors(controls("INT32", 0, 1), [END_ROW, END_ROW], batching=False)


def test_only_declared_controls_are_built() -> None:
    only_ready = ControlInputs(ready=BoolControl("R", "BOOL", False, True))
    assert set(build_control_tensors(only_ready, [START_ROW], batching=True)) == {"R"}
    assert build_control_tensors(ControlInputs(), [START_ROW], batching=True) == {}


@pytest.mark.parametrize(
    ("data_type", "dtype", "correlation_id", "expected"),
    [
        ("UINT64", np.uint64, 2**64 - 1, 2**64 - 1),
        ("INT64", np.int64, 2**64 - 1, -1),
        ("INT64", np.int64, 42, 42),
        ("UINT32", np.uint32, 2**32 + 5, 5),
        ("INT32", np.int32, 2**32 - 2, -2),
        ("INT32", np.int32, 77, 77),
    ],
)
def test_integer_corrid_keeps_the_low_bits_of_the_uint64_id(
    data_type: str, dtype: type[np.generic], correlation_id: int, expected: int
) -> None:
    corrid = ControlInputs(corrid=CorridControl("C", data_type))
    rows = [RowControl.for_request(request(1, correlation_id, START)), NOT_READY]
    tensor = build_control_tensors(corrid, rows, batching=True)["C"]
    assert tensor.dtype == np.dtype(dtype)
    assert tensor.shape == (2, 1)
    assert tensor[:, 0].tolist() == [expected, 0]
    assert corrid_integer(data_type, correlation_id) == expected


@pytest.mark.parametrize(
    ("data_type", "correlation_id", "expected"),
    [
        # Triton 2.51 measured: "a" -> 01 00 00 00 61 then bytes it left unwritten (zero here)
        ("UINT64", "a", 0x61_00000001),
        ("UINT64", "abcdefgh", 0x64636261_00000008),  # length 8, then "abcd"
        ("INT64", "\xff\xff\xff", int.from_bytes(b"\x06\0\0\0\xc3\xbf\xc3\xbf", "little",
                                              signed=True)),
        ("UINT32", "abcdefgh", 8),  # a 4-byte control holds only the length
        ("INT32", "x" * 128, 128),
    ],
)
def test_a_string_id_gives_an_integer_corrid_the_leading_bytes_of_its_bytes_element(
    data_type: str, correlation_id: str, expected: int
) -> None:
    assert corrid_integer(data_type, correlation_id) == expected
    corrid = ControlInputs(corrid=CorridControl("C", data_type))
    rows = [RowControl.for_request(request(1, correlation_id, START)), NOT_READY]
    tensor = build_control_tensors(corrid, rows, batching=True)["C"]
    assert tensor[:, 0].tolist() == [expected, 0]


def test_string_corrid_is_a_bytes_tensor_and_empty_for_a_not_ready_row() -> None:
    corrid = ControlInputs(corrid=CorridControl("C", "BYTES"))
    rows = [RowControl.for_request(request(1, "seq-é", START)), NOT_READY]
    tensor = build_control_tensors(corrid, rows, batching=True)["C"]
    assert tensor.dtype == np.dtype(object)
    assert tensor.shape == (2, 1)
    assert tensor[:, 0].tolist() == ["seq-é".encode(), b""]


def test_row_control_reads_the_request_flags() -> None:
    assert (START_END_ROW.start, START_END_ROW.end, START_END_ROW.ready) == (True, True, True)
    assert (CONTINUE_ROW.start, CONTINUE_ROW.end, CONTINUE_ROW.ready) == (False, False, True)
    assert (START_END_ROW.correlation_id, CONTINUE_ROW.correlation_id) == (10, 8)
    assert (NOT_READY.start, NOT_READY.end, NOT_READY.ready) == (False, False, False)
    assert NOT_READY.correlation_id == 0
