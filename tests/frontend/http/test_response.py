"""Response encoding: JSON data of every datatype, binary outputs, classification, header."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import orjson
import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.frontend.core.validation import InferPlan, OutputPlan
from shoal.frontend.http.response import classify, encode_infer_response, json_data
from shoal.messages import InferResponse, TensorRef


def frame(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


NUMERIC = [
    ("BOOL", np.bool_, [True, False]), ("UINT8", np.uint8, [0, 255]),
    ("UINT16", np.uint16, [0, 65535]), ("UINT32", np.uint32, [0, 2**32 - 1]),
    ("UINT64", np.uint64, [0, 2**64 - 1]), ("INT8", np.int8, [-128, 127]),
    ("INT16", np.int16, [-32768, 32767]), ("INT32", np.int32, [-(2**31), 2**31 - 1]),
    ("INT64", np.int64, [-(2**63), 2**63 - 1]), ("FP32", np.float32, [1.5, -0.25]),
    ("FP64", np.float64, [1e300, -2.5]),
]


@pytest.mark.parametrize("datatype,np_type,values", NUMERIC, ids=[c[0] for c in NUMERIC])
def test_json_data_of_every_numeric_datatype(datatype: str, np_type: Any,
                                             values: list[Any]) -> None:
    raw = np.array(values, np_type).tobytes()
    text = orjson.dumps({"data": json_data("O", datatype, [2], raw)},
                        option=orjson.OPT_SERIALIZE_NUMPY)
    assert json.loads(text)["data"] == values


def test_json_bytes_output_is_strings() -> None:
    assert json_data("O", "BYTES", [2], frame("é".encode(), b"")) == ["é", ""]


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_json_output_is_refused(datatype: str) -> None:
    with pytest.raises(ShoalError) as info:
        json_data("HALF", datatype, [1], b"\0\0")
    assert info.value.message == (f"sending {datatype} data via JSON is not supported. Please "
                                  "use the binary data format for output")  # Triton's text


def test_non_finite_floats_are_written_as_json_strings() -> None:
    raw = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32).tobytes()
    text = orjson.dumps({"data": json_data("O", "FP32", [4], raw)},
                        option=orjson.OPT_SERIALIZE_NUMPY)
    assert text == b'{"data":["NaN","Infinity","-Infinity",1.0]}'


@pytest.mark.parametrize(("datatype", "values", "expected"), [
    ("FP32", [3e38, -3e38, 1.0], b"[3e+38,-3e+38,1.0]"),
    ("FP64", [1e200, -1e200], b"[1e+200,-1e+200]"),
    ("FP32", [3e38, np.nan], b'[3.0000000054977558e+38,"NaN"]'),
    ("FP64", [1.0, -np.inf], b'[1.0,"-Infinity"]'),
    ("FP32", [], b"[]"),
])
def test_finite_check_of_json_floats(datatype: str, values: list[float], expected: bytes) -> None:
    raw = np.array(values, np.float32 if datatype == "FP32" else np.float64).tobytes()
    text = orjson.dumps(json_data("O", datatype, [len(values)], raw),
                        option=orjson.OPT_SERIALIZE_NUMPY)
    assert text == expected


def test_output_size_that_does_not_match_the_shape_is_internal() -> None:
    with pytest.raises(ShoalError) as info:
        json_data("O", "INT32", [3], b"\0" * 8)
    assert info.value.code is ErrorCode.INTERNAL
    with pytest.raises(ShoalError):
        json_data("O", "BYTES", [2], frame(b"a"))


# ---------------------------------------------------------------- classification


def _ref(datatype: str, shape: list[int], nbytes: int, name: str = "PROB") -> TensorRef:
    return TensorRef(name, datatype, shape, "/r", 0, nbytes)


def _strings(data: bytes) -> list[str]:
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<I", data, pos)
        out.append(data[pos + 4:pos + 4 + length].decode())
        pos += 4 + length
    return out


def test_classification_is_top_n_value_index_strings() -> None:
    values = np.array([0.1, 3.3, 0.7, 2.0], np.float32)
    datatype, shape, data = classify(_ref("FP32", [4], 16), memoryview(values.tobytes()), 2,
                                     batching=False)
    assert (datatype, shape) == ("BYTES", [2])
    assert _strings(data) == ["3.300000:1", "2.000000:3"]


def test_classification_per_batch_entry() -> None:
    values = np.array([[1, 5, 3], [9, 2, 9]], np.int32)
    _, shape, data = classify(_ref("INT32", [2, 3], 24), memoryview(values.tobytes()), 5,
                              batching=True)
    assert shape == [2, 3]
    assert _strings(data) == ["5:1", "3:2", "1:0", "9:0", "9:2", "2:1"]


def test_classifying_more_than_a_million_elements_per_entry_is_refused() -> None:
    limit = 1_000_000
    fits = np.zeros(limit, np.uint8)
    _, shape, _ = classify(_ref("UINT8", [limit], limit), memoryview(fits.tobytes()), 1,
                           batching=False)
    assert shape == [1]
    over = np.zeros(limit + 1, np.uint8)
    with pytest.raises(ShoalError) as caught:
        classify(_ref("UINT8", [limit + 1], limit + 1), memoryview(over.tobytes()), 1,
                 batching=False)
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message == "classification output tensor too large"
    two_rows = np.zeros((2, limit), np.uint8)  # the bound is per batch entry, as Triton's
    _, shape, _ = classify(_ref("UINT8", [2, limit], 2 * limit),
                           memoryview(two_rows.tobytes()), 1, batching=True)
    assert shape == [2, 1]


def test_classification_of_unsupported_type_is_refused() -> None:
    with pytest.raises(ShoalError):
        classify(_ref("BOOL", [2], 2), memoryview(b"\0\1"), 1, batching=False)


# ---------------------------------------------------------------- whole response


def _encode(outputs: list[tuple[TensorRef, bytes]], plan: InferPlan, **kwargs: Any) -> Any:
    store = {ref.name: data for ref, data in outputs}
    response = InferResponse(1, 1, [ref for ref, _ in outputs], kwargs.pop("parameters", {}))
    return encode_infer_response(response, model_name="m", model_version=3,
                                 client_id=kwargs.pop("client_id", ""), plan=plan,
                                 batching=kwargs.pop("batching", False),
                                 output_view=lambda ref: memoryview(store[ref.name]))


def test_json_response_header() -> None:
    ref = _ref("INT32", [2], 8, "OUT")
    plan = InferPlan(1, [OutputPlan("OUT", "INT32", False)], False, False)
    encoded = _encode([(ref, np.array([1, 2], np.int32).tobytes())], plan, client_id="x",
                      parameters={"p": 1})
    assert not encoded.has_binary
    assert json.loads(encoded.body) == {
        "id": "x", "model_name": "m", "model_version": "3", "parameters": {"p": 1},
        "outputs": [{"name": "OUT", "datatype": "INT32", "shape": [2], "data": [1, 2]}]}


def test_binary_outputs_follow_the_header_in_order() -> None:
    first, second = _ref("INT32", [1], 4, "A"), _ref("FP32", [1], 4, "B")
    plan = InferPlan(1, [OutputPlan("A", "INT32", True), OutputPlan("B", "FP32", True)],
                     False, True)
    encoded = _encode([(first, b"aaaa"), (second, b"bbbb")], plan)
    assert encoded.has_binary and encoded.body[encoded.json_length:] == b"aaaabbbb"
    header = json.loads(encoded.body[:encoded.json_length])
    assert "id" not in header
    assert [o["parameters"] for o in header["outputs"]] == [{"binary_data_size": 4}] * 2


def test_outputs_not_requested_are_left_out() -> None:
    plan = InferPlan(1, [OutputPlan("A", "INT32", False)], True, False)
    encoded = _encode([(_ref("INT32", [1], 4, "A"), b"\0" * 4),
                       (_ref("INT32", [1], 4, "B"), b"\0" * 4)], plan)
    assert [o["name"] for o in json.loads(encoded.body)["outputs"]] == ["A"]


def test_classification_output_in_the_response() -> None:
    plan = InferPlan(1, [OutputPlan("P", "FP32", False, classification=1)], True, False)
    values = np.array([[0.2, 0.8]], np.float32)
    encoded = _encode([(_ref("FP32", [1, 2], 8, "P"), values.tobytes())], plan, batching=True)
    assert json.loads(encoded.body)["outputs"] == [
        {"name": "P", "datatype": "BYTES", "shape": [1, 1], "data": ["0.800000:1"]}]
