"""Request body decoding: header split, JSON and binary inputs, parameters, outputs, raw binary."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.frontend.core.decoded import SEQUENCE_END, SEQUENCE_START, DecodedRequest
from shoal.frontend.http.codec import decode_infer_request, split_body
from shoal.frontend.http.json_tensors import may_hold_booleans
from shoal.messages import TensorSpec
from tests.frontend.http.fakes import make_model

LIMIT = 64 * 1024 * 1024
MODEL = make_model("m", [TensorSpec("INPUT0", "FP32", [-1]), TensorSpec("INPUT1", "INT32", [-1])])


def decode(document: dict[str, Any], binary: bytes = b"", *, header: bool | None = None,
           model: Any = MODEL, limit: int = LIMIT) -> DecodedRequest:
    head = json.dumps(document).encode()
    use_header = bool(binary) if header is None else header
    return decode_infer_request(head + binary, str(len(head)) if use_header else None, model,
                                limit)


def error_of(call: Any) -> ShoalError:
    with pytest.raises(ShoalError) as info:
        call()
    return info.value


def bytes_frame(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


# ---------------------------------------------------------------- Inference-Header-Content-Length


def test_no_header_length_means_the_whole_body_is_json() -> None:
    body = memoryview(b'{"inputs": []}')
    parts = split_body(body, None)
    assert parts is not None
    assert bytes(parts[0]) == b'{"inputs": []}' and len(parts[1]) == 0


def test_header_length_splits_json_from_binary() -> None:
    parts = split_body(memoryview(b"{}abcd"), "2")
    assert parts is not None
    assert bytes(parts[0]) == b"{}" and bytes(parts[1]) == b"abcd"


def test_header_length_equal_to_body_is_accepted() -> None:
    parts = split_body(memoryview(b"{}"), "2")
    assert parts is not None and len(parts[1]) == 0


def test_header_length_zero_is_a_raw_request() -> None:
    assert split_body(memoryview(b"abcd"), "0") is None


@pytest.mark.parametrize("value", ["-1", "5", "99999999999"])
def test_header_length_out_of_range_is_rejected(value: str) -> None:
    error = error_of(lambda: split_body(memoryview(b"{}ab"), value))
    assert error.code is ErrorCode.INVALID_ARG
    assert "inference header size should be in range (0, 4)" in error.message  # Triton's
    assert value in error.message


def test_header_length_not_a_number_is_rejected() -> None:
    error = error_of(lambda: split_body(memoryview(b"{}"), "abc"))
    assert "Inference-Header-Content-Length" in error.message


# ---------------------------------------------------------------- JSON inputs, every datatype

JSON_CASES = [
    ("BOOL", [True, False, True], np.bool_),
    ("UINT8", [0, 7, 255], np.uint8),
    ("UINT16", [0, 7, 65535], np.uint16),
    ("UINT32", [0, 7, 2**32 - 1], np.uint32),
    ("UINT64", [0, 7, 2**64 - 1], np.uint64),
    ("INT8", [-128, 0, 127], np.int8),
    ("INT16", [-32768, 0, 32767], np.int16),
    ("INT32", [-(2**31), 0, 2**31 - 1], np.int32),
    ("INT64", [-(2**63), 0, 2**63 - 1], np.int64),
    ("FP32", [1.5, -2, 3.25], np.float32),
    ("FP64", [1.5, -2, 1e300], np.float64),
]


@pytest.mark.parametrize("datatype,values,np_type", JSON_CASES, ids=[c[0] for c in JSON_CASES])
def test_json_data_of_every_numeric_datatype(datatype: str, values: list[Any],
                                             np_type: Any) -> None:
    request = decode({"inputs": [{"name": "X", "datatype": datatype, "shape": [3],
                                  "data": values}]})
    tensor = request.inputs[0]
    assert tensor.datatype == datatype and tensor.shape == [3] and tensor.element_count == 3
    assert np.array_equal(np.frombuffer(tensor.data, np_type), np.array(values, np_type))


def test_json_bytes_are_utf8_strings_in_length_framing() -> None:
    request = decode({"inputs": [{"name": "S", "datatype": "BYTES", "shape": [2],
                                  "data": ["héllo", ""]}]})
    assert bytes(request.inputs[0].data) == bytes_frame("héllo".encode(), b"")


def test_nested_json_data_is_flattened_row_major() -> None:
    request = decode({"inputs": [{"name": "X", "datatype": "INT32", "shape": [2, 2],
                                  "data": [[1, 2], [3, 4]]}]})
    assert np.frombuffer(request.inputs[0].data, np.int32).tolist() == [1, 2, 3, 4]


def test_ragged_nesting_is_flattened_when_the_count_matches() -> None:
    request = decode({"inputs": [{"name": "X", "datatype": "INT32", "shape": [3],
                                  "data": [[1, 2], [3]]}]})
    assert np.frombuffer(request.inputs[0].data, np.int32).tolist() == [1, 2, 3]


def test_nested_bytes_data_is_flattened() -> None:
    request = decode({"inputs": [{"name": "S", "datatype": "BYTES", "shape": [2, 1],
                                  "data": [["a"], ["bc"]]}]})
    assert bytes(request.inputs[0].data) == bytes_frame(b"a", b"bc")


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_json_is_rejected(datatype: str) -> None:
    error = error_of(lambda: decode({"inputs": [{"name": "H", "datatype": datatype,
                                                 "shape": [1], "data": [1.0]}]}))
    assert error.message == (f"receiving {datatype} data via JSON is not supported. Please use "
                             "the binary data format for input H")  # Triton's text


@pytest.mark.parametrize("datatype", ["FP16", "BYTES", "FP32"])
def test_json_data_of_no_elements_is_not_read(datatype: str) -> None:
    request = decode({"inputs": [{"name": "Z", "datatype": datatype, "shape": [0],
                                  "data": "anything"}]})  # Triton reads no data then
    assert request.inputs[0].element_count == 0 and len(request.inputs[0].data) == 0


@pytest.mark.parametrize("datatype,values", [("INT8", [128]), ("UINT8", [-1]), ("INT16", [-40000])])
def test_json_integers_out_of_range_are_rejected_naming_the_input(datatype: str,
                                                                  values: list[Any]) -> None:
    error = error_of(lambda: decode({"inputs": [{"name": "V", "datatype": datatype,
                                                 "shape": [1], "data": values}]}))
    assert error.code is ErrorCode.INVALID_ARG
    assert "Unable to parse 'data' for input 'V': expected integer in [" in error.message


@pytest.mark.parametrize("datatype,values,wanted", [
    ("UINT64", [2**64], "non-unsigned-integer as unsigned-integer"),
    ("INT32", [1.5], "non-signed-integer as signed-integer"),
    ("INT64", [True], "non-signed-integer as signed-integer"),
    ("BOOL", [1], "non-boolean as boolean"),
    ("FP32", ["a"], "non-number as double"),
    ("FP64", [None], "non-number as double"),
    ("FP32", [1.0, True], "non-number as double"),
    ("FP32", [[1.0], [False]], "non-number as double"),
])
def test_json_values_of_the_wrong_type_get_tritons_text(datatype: str, values: list[Any],
                                                        wanted: str) -> None:
    error = error_of(lambda: decode({"inputs": [{"name": "V", "datatype": datatype,
                                                 "shape": [len(values)], "data": values}]}))
    assert error.code is ErrorCode.INVALID_ARG
    assert error.message == f"Unable to parse 'data': attempt to access JSON {wanted}"


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16", "utf-32-le"])
@pytest.mark.parametrize("header", [False, True])
def test_a_boolean_among_numbers_is_found_in_any_body_json_takes(encoding: str,
                                                                header: bool) -> None:
    """The search for true / false among numbers is skipped only for a body that has none."""
    document = {"inputs": [{"name": "V", "datatype": "FP32", "shape": [2], "data": [1, True]}]}
    head = json.dumps(document).encode(encoding)
    body = head + struct.pack("<f", 1.0) if header else head
    error = error_of(lambda: decode_infer_request(
        memoryview(body), str(len(head)) if header else None, MODEL, LIMIT))
    assert error.message == "Unable to parse 'data': attempt to access JSON non-number as double"
    plain = json.dumps({"inputs": [{"name": "V", "datatype": "FP32", "shape": [2],
                                    "data": [1, 2]}]}).encode(encoding)
    assert bytes(decode_infer_request(plain, None, MODEL, LIMIT).inputs[0].data) == (
        struct.pack("<2f", 1.0, 2.0))


def test_may_hold_booleans() -> None:
    assert not may_hold_booleans(b'{"data": [1, 2.5e-3, "t", "f"]}')
    assert may_hold_booleans(b'{"data": [1], "p": true}')
    assert may_hold_booleans(b'{"data": [false]}')
    assert may_hold_booleans('{"data": [1]}'.encode("utf-16"))


def test_json_bytes_elements_must_be_strings() -> None:
    error = error_of(lambda: decode({"inputs": [{"name": "S", "datatype": "BYTES",
                                                 "shape": [2], "data": ["a", 1]}]}))
    assert error.message == ("Unable to parse JSON bytes array: attempt to access JSON "
                             "non-string as string")


@pytest.mark.parametrize("datatype,data", [("FP32", [1.0, 2.0])])  # BYTES: validation counts
def test_json_element_count_must_match_the_shape(datatype: str, data: list[Any]) -> None:
    error = error_of(lambda: decode({"inputs": [{"name": "C", "datatype": datatype,
                                                 "shape": [3], "data": data}]}))
    assert f"expected 3 elements to match 'shape', got {len(data)}" in error.message
    assert "'C'" in error.message


def test_json_data_must_be_an_array() -> None:
    error = error_of(lambda: decode({"inputs": [{"name": "D", "datatype": "FP32",
                                                 "shape": [1], "data": 1.0}]}))
    assert error.message == "Unable to parse 'data': attempt to access JSON non-array as array"


# ---------------------------------------------------------------- shapes and sizes


def test_negative_dimension_is_a_client_error_naming_the_input() -> None:
    error = error_of(lambda: decode({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                                 "shape": [2, -5], "data": [1.0]}]}))
    assert error.code is ErrorCode.INVALID_ARG
    assert "Unable to parse 'shape' for input 'INPUT0'" in error.message


@pytest.mark.parametrize("shape", [[1.5], "3", [True], None])
def test_shape_must_be_integers(shape: Any) -> None:
    error = error_of(lambda: decode({"inputs": [{"name": "S", "datatype": "FP32",
                                                 "shape": shape, "data": [1.0]}]}))
    assert "Unable to parse 'shape' for input 'S'" in error.message


def test_element_count_overflow_is_rejected() -> None:
    error = error_of(lambda: decode({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                                 "shape": [16, 2**60 + 2], "data": [1.0]}]}))
    assert error.code is ErrorCode.INVALID_ARG
    assert "causes total element count to exceed maximum size of" in error.message
    assert "'INPUT0'" in error.message


def test_byte_size_overflow_is_rejected() -> None:
    error = error_of(lambda: decode({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                                 "shape": [4, 2**60 + 2], "data": [1.0]}]}))
    assert "byte size overflow for input 'INPUT0'" in error.message


def test_declared_tensor_size_over_the_limit_is_refused_before_conversion() -> None:
    error = error_of(lambda: decode({"inputs": [{"name": "BIG", "datatype": "INT64",
                                                 "shape": [200], "data": [0] * 200}]},
                                    limit=1000))
    assert "exceeds the maximum allowed value of 1000 bytes" in error.message
    assert "'BIG'" in error.message


def test_json_bytes_over_the_limit_are_refused() -> None:
    error = error_of(lambda: decode({"inputs": [{"name": "S", "datatype": "BYTES",
                                                 "shape": [1], "data": ["x" * 2000]}]},
                                    limit=1000))
    assert "exceeds the maximum allowed value" in error.message


@pytest.mark.parametrize("item,needle", [
    ({"datatype": "FP32", "shape": [1], "data": [1]}, "'name'"),
    ({"name": 3, "datatype": "FP32", "shape": [1], "data": [1]}, "'name'"),
    ({"name": "A", "shape": [1], "data": [1]}, "'datatype' for input 'A'"),
    ({"name": "A", "datatype": "FLOAT", "shape": [1], "data": [1]},
     "invalid datatype for input A"),
    ({"name": "A", "datatype": "FP32", "shape": [1]}, "But no field is set"),
    ({"name": "A", "datatype": "FP32", "shape": [1], "data": [1],
      "parameters": {"binary_data_size": 4}}, "But set 'data' 'binary_data_size'"),
])
def test_malformed_input_entries_name_the_field(item: dict[str, Any], needle: str) -> None:
    error = error_of(lambda: decode({"inputs": [item]}, b"\0" * 4, header=True))
    assert error.code is ErrorCode.INVALID_ARG
    assert needle in error.message


def test_inputs_must_be_an_array_of_objects() -> None:
    assert "'inputs'" in error_of(lambda: decode({"inputs": {"a": 1}})).message
    assert "'inputs'" in error_of(lambda: decode({"inputs": [1]})).message
    assert "'inputs'" in error_of(lambda: decode({})).message


# ---------------------------------------------------------------- binary inputs
# (shared-memory parameters: tests/frontend/http/test_shared_memory_http.py)


@pytest.mark.parametrize("datatype,np_type", [
    ("BOOL", np.bool_), ("UINT8", np.uint8), ("UINT16", np.uint16), ("UINT32", np.uint32),
    ("UINT64", np.uint64), ("INT8", np.int8), ("INT16", np.int16), ("INT32", np.int32),
    ("INT64", np.int64), ("FP16", np.float16), ("FP32", np.float32), ("FP64", np.float64),
    ("BF16", np.uint16),
])
def test_binary_input_of_every_datatype_is_a_view_of_the_body(datatype: str,
                                                              np_type: Any) -> None:
    values = np.arange(6).astype(np_type)
    request = decode({"inputs": [{"name": "B", "datatype": datatype, "shape": [2, 3],
                                  "parameters": {"binary_data_size": values.nbytes}}]},
                     values.tobytes())
    assert bytes(request.inputs[0].data) == values.tobytes()


def test_binary_inputs_consume_the_body_in_json_order() -> None:
    doc = {"inputs": [
        {"name": "INPUT1", "datatype": "INT32", "shape": [1],
         "parameters": {"binary_data_size": 4}},
        {"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]},
        {"name": "S", "datatype": "BYTES", "shape": [1],
         "parameters": {"binary_data_size": 6}},
    ]}
    request = decode(doc, struct.pack("<i", 7) + bytes_frame(b"ab"))
    assert bytes(request.inputs[0].data) == struct.pack("<i", 7)
    assert bytes(request.inputs[2].data) == bytes_frame(b"ab")


def test_binary_input_short_of_bytes_names_the_missing_count() -> None:
    doc = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [4],
                       "parameters": {"binary_data_size": 16}}]}
    error = error_of(lambda: decode(doc, b"\0" * 10))
    assert "unexpected size for input 'X', expecting 6 additional bytes for model 'm'" \
        in error.message


def test_binary_input_without_header_length_is_short() -> None:
    doc = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1],
                       "parameters": {"binary_data_size": 4}}]}
    error = error_of(lambda: decode(doc, header=False))
    assert "expecting 4 additional bytes" in error.message


def test_leftover_binary_data_is_rejected() -> None:
    doc = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1],
                       "parameters": {"binary_data_size": 4}}]}
    error = error_of(lambda: decode(doc, b"\0" * 6))
    assert "unexpected additional input data for model 'm'" in error.message


def test_binary_data_size_must_be_a_non_negative_integer() -> None:
    doc = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1],
                       "parameters": {"binary_data_size": -4}}]}
    assert "'binary_data_size' for input 'X'" in error_of(lambda: decode(doc, b"\0")).message


# ---------------------------------------------------------------- request fields


def test_id_and_reserved_parameters_fill_their_fields() -> None:
    request = decode({"id": "req-7", "inputs": [], "parameters": {
        "priority": 2, "timeout": 1500, "sequence_id": 42, "sequence_start": True,
        "sequence_end": True, "binary_data_output": True, "custom": "x", "n": -3,
        "f": 0.5, "b": False}})
    assert request.client_id == "req-7"
    assert (request.priority, request.timeout_us, request.correlation_id) == (2, 1500, 42)
    assert request.flags == SEQUENCE_START | SEQUENCE_END
    assert request.binary_output_default is True
    assert request.parameters == {"custom": "x", "n": -3, "f": 0.5, "b": False}


def test_string_sequence_id_is_kept_as_a_string() -> None:
    request = decode({"inputs": [], "parameters": {"sequence_id": "abc",
                                                   "sequence_start": False}})
    assert request.correlation_id == "abc" and request.flags == 0


def test_a_string_sequence_id_over_128_bytes_is_unsupported() -> None:
    assert decode({"inputs": [], "parameters": {"sequence_id": "x" * 128}}).correlation_id \
        == "x" * 128
    error = error_of(lambda: decode({"inputs": [], "parameters": {"sequence_id": "é" * 65}}))
    assert error.code is ErrorCode.UNSUPPORTED
    assert error.message == "string correlation ID cannot be longer than 128 characters"


@pytest.mark.parametrize("parameters,needle", [
    ({"triton_enable_empty_final_response": True}, "reserved for Triton"),
    ({"priority": -1}, "'priority'"),
    ({"priority": True}, "'priority'"),
    ({"timeout": 1.5}, "'timeout'"),
    ({"sequence_id": -2}, "'sequence_id'"),
    ({"sequence_start": 1}, "'sequence_start'"),
    ({"binary_data_output": "yes"}, "'binary_data_output'"),
    ({"headers": {"a": "b"}}, "'headers'"),
    ({"custom": [1, 2]}, "parameter 'custom' has invalid type"),
    ({"custom": {"a": 1}}, "parameter 'custom' has invalid type"),
])
def test_bad_request_parameters_are_rejected(parameters: dict[str, Any], needle: str) -> None:
    error = error_of(lambda: decode({"inputs": [], "parameters": parameters}))
    assert error.code is ErrorCode.INVALID_ARG and needle in error.message


def test_id_must_be_a_string() -> None:
    assert "'id'" in error_of(lambda: decode({"id": 5, "inputs": []})).message


def test_requested_outputs_carry_their_parameters() -> None:
    request = decode({"inputs": [], "outputs": [
        {"name": "A", "parameters": {"binary_data": True, "classification": 3, "k": "v"}},
        {"name": "B"}]})
    first, second = request.outputs
    assert (first.name, first.binary, first.classification, first.parameters) == \
        ("A", True, 3, {"k": "v"})
    assert (second.name, second.binary, second.classification) == ("B", None, 0)


@pytest.mark.parametrize("outputs,needle", [
    ({"name": "A"}, "'outputs'"),
    ([{"parameters": {}}], "'name' of an output"),
    ([{"name": "A", "parameters": {"binary_data": 1}}], "'binary_data' for output 'A'"),
    ([{"name": "A", "parameters": {"classification": -1}}], "'classification' for output 'A'"),
])
def test_malformed_outputs_name_the_field(outputs: Any, needle: str) -> None:
    assert needle in error_of(lambda: decode({"inputs": [], "outputs": outputs})).message


def test_header_must_be_a_json_object() -> None:
    error = error_of(lambda: decode_infer_request(b"[1, 2]", None, MODEL, LIMIT))
    assert "expected a JSON object" in error.message


def test_malformed_json_is_a_client_error() -> None:
    error = error_of(lambda: decode_infer_request(b'{"inputs": [', None, MODEL, LIMIT))
    assert error.code is ErrorCode.INVALID_ARG
    assert "failed to parse the request JSON" in error.message


def test_nan_and_infinity_literals_are_accepted_in_json_data() -> None:
    body = b'{"inputs": [{"name": "F", "datatype": "FP32", "shape": [3], ' \
           b'"data": [NaN, Infinity, -Infinity]}]}'
    values = np.frombuffer(decode_infer_request(body, None, MODEL, LIMIT).inputs[0].data,
                           np.float32)
    assert np.isnan(values[0]) and values[1] == np.inf and values[2] == -np.inf


# ---------------------------------------------------------------- raw binary requests


def test_raw_request_deduces_the_variable_dimension() -> None:
    model = make_model("raw", [TensorSpec("INPUT0", "FP32", [-1])], max_batch_size=8)
    body = np.arange(8, dtype=np.float32).tobytes()
    request = decode_infer_request(body, "0", model, LIMIT)
    assert request.raw and request.binary_output_default
    tensor = request.inputs[0]
    assert (tensor.name, tensor.datatype, tensor.shape) == ("INPUT0", "FP32", [1, 8])
    assert bytes(tensor.data) == body


def test_raw_request_for_non_batching_fixed_shape() -> None:
    model = make_model("raw", [TensorSpec("INPUT0", "INT32", [2, 2])])
    request = decode_infer_request(b"\0" * 16, "0", model, LIMIT)
    assert request.inputs[0].shape == [2, 2]


def test_raw_request_needs_exactly_one_model_input() -> None:
    error = error_of(lambda: decode_infer_request(b"\0" * 8, "0", MODEL, LIMIT))
    assert "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in " \
           "'m' model configuration" in error.message


def test_raw_request_with_two_variable_dimensions_is_rejected() -> None:
    model = make_model("raw", [TensorSpec("INPUT0", "FP16", [-1, -1])])
    error = error_of(lambda: decode_infer_request(b"\0" * 8, "0", model, LIMIT))
    assert "The shape of the raw input 'INPUT0' can not be deduced because there are more " \
           "than one variable-sized dimension" in error.message


def test_raw_bytes_request_is_one_element() -> None:
    model = make_model("raw", [TensorSpec("INPUT0", "BYTES", [1])])
    request = decode_infer_request(b"427", "0", model, LIMIT)
    assert bytes(request.inputs[0].data) == bytes_frame(b"427")


def test_raw_bytes_request_needs_shape_one() -> None:
    model = make_model("raw", [TensorSpec("INPUT0", "BYTES", [-1])])
    error = error_of(lambda: decode_infer_request(b"427", "0", model, LIMIT))
    assert "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]" \
        in error.message


# ---------------------------------------------------------------- the usual requests' paths


def test_null_request_parameters_are_no_parameters_but_a_null_input_one_is_refused() -> None:
    request = decode({"parameters": None, "inputs": [
        {"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}]})
    assert request.parameters == {} and request.inputs[0].shm is None
    error = error_of(lambda: decode({"inputs": [
        {"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0], "parameters": None}]}))
    assert error.message == "Unable to parse 'parameters' for input 'X'"


@pytest.mark.parametrize("data", [[1, 2, 3, 4], [[1, 2], [3, 4]], [1, 2.5, 3, 4]])
def test_fp32_json_data_of_ints_nested_or_mixed_numbers(data: list[Any]) -> None:
    request = decode({"inputs": [{"name": "X", "datatype": "FP32", "shape": [2, 2],
                                  "data": data}]})
    assert np.frombuffer(request.inputs[0].data, np.float32).tolist() == \
        np.array(data, np.float64).reshape(-1).tolist()


@pytest.mark.parametrize("data,got", [([[1.0, 2.0], [3.0]], 3), ([1.0] * 5, 5), ([], 0)])
def test_fp32_json_data_of_the_wrong_count_is_refused_naming_both(data: list[Any],
                                                                  got: int) -> None:
    error = error_of(lambda: decode({"inputs": [{"name": "X", "datatype": "FP32",
                                                 "shape": [2, 2], "data": data}]}))
    assert error.message == \
        f"Unable to parse 'data' for input 'X': expected 4 elements to match 'shape', got {got}"
