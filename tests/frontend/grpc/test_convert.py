"""ModelInferRequest -> DecodedRequest: raw and typed contents, shared-memory references,
parameters (Triton's gRPC rules), and validation shared with HTTP."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from shoal import dtypes
from shoal.errors import ErrorCode, ShoalError
from shoal.frontend.core.decoded import SEQUENCE_END, SEQUENCE_START
from shoal.frontend.core.shm_params import SharedMemorySlice
from shoal.frontend.core.validation import validate_request
from shoal.frontend.grpc.convert import decode_model_infer_request, typed_contents_bytes
from shoal.messages import TensorSpec
from tests.frontend.http.fakes import make_model

MODEL = make_model("m", [TensorSpec("A", "FP32", [-1]), TensorSpec("B", "INT32", [-1])])
TYPED: dict[str, tuple[str, list[Any]]] = {
    "BOOL": ("bool_contents", [True, False, True]),
    "INT8": ("int_contents", [-128, 0, 127]),
    "INT16": ("int_contents", [-32768, 5, 32767]),
    "INT32": ("int_contents", [-(2**31), 7, 2**31 - 1]),
    "INT64": ("int64_contents", [-(2**63), 1, 2**63 - 1]),
    "UINT8": ("uint_contents", [0, 1, 255]),
    "UINT16": ("uint_contents", [0, 1, 65535]),
    "UINT32": ("uint_contents", [0, 1, 2**32 - 1]),
    "UINT64": ("uint64_contents", [0, 1, 2**64 - 1]),
    "FP32": ("fp32_contents", [0.5, -1.25, 3.0]),
    "FP64": ("fp64_contents", [0.1, -2.5, 1e300]),
    "BYTES": ("bytes_contents", [b"a", b"", b"\x00\xff"]),
}


def request(**fields: Any) -> Any:
    return pb.ModelInferRequest(model_name="m", **fields)


def tensor(name: str, datatype: str, shape: list[int], **fields: Any) -> Any:
    return pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape,
                                                 **fields)


def fails(message: Any, text: str, code: ErrorCode = ErrorCode.INVALID_ARG) -> None:
    with pytest.raises(ShoalError) as caught:
        decode_model_infer_request(message, MODEL)
    assert caught.value.code is code
    assert text in caught.value.message


def raw_request() -> Any:
    return request(inputs=[tensor("A", "FP32", [2]), tensor("B", "INT32", [1])],
                   raw_input_contents=[np.array([1, 2], np.float32).tobytes(),
                                       np.array([3], np.int32).tobytes()])


# ------------------------------------------------------------------------ tensor data


def test_raw_contents_map_in_order_to_the_inputs() -> None:
    decoded = decode_model_infer_request(raw_request(), MODEL).request
    assert [(t.name, t.datatype, t.shape, t.element_count) for t in decoded.inputs] == [
        ("A", "FP32", [2], 2), ("B", "INT32", [1], 1)]
    assert bytes(decoded.inputs[0].data) == np.array([1, 2], np.float32).tobytes()
    assert decoded.binary_output_default  # gRPC outputs are always raw (FP16 allowed)


@pytest.mark.parametrize("datatype", sorted(TYPED))
def test_typed_contents_give_the_same_bytes_as_raw(datatype: str) -> None:
    field_name, values = TYPED[datatype]
    contents = pb.InferTensorContents(**{field_name: values})
    data = typed_contents_bytes(contents, datatype, "X", "m")
    if datatype == "BYTES":
        assert bytes(data) == dtypes.serialize_bytes(values)
    else:
        assert bytes(data) == np.array(values, dtypes.numpy_dtype(datatype)).tobytes()


def test_contents_of_another_type_are_refused_with_tritons_message() -> None:
    message = request(inputs=[tensor("A", "FP32", [1],
                                     contents=pb.InferTensorContents(int_contents=[1]))])
    fails(message, "unexpected explicit tensor data for input tensor 'A' for model 'm' of type "
                   "'INT32', expected datatype 'FP32'")


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_has_no_typed_contents(datatype: str) -> None:
    contents = pb.InferTensorContents(fp32_contents=[1.0])
    with pytest.raises(ShoalError, match=f"expected datatype '{datatype}'"):
        typed_contents_bytes(contents, datatype, "X", "m")


def test_two_contents_fields_are_refused() -> None:
    contents = pb.InferTensorContents(int_contents=[1], fp32_contents=[1.0])
    with pytest.raises(ShoalError, match="binary data was already supplied"):
        typed_contents_bytes(contents, "INT32", "X", "m")


@pytest.mark.parametrize("datatype,value", [("INT8", 128), ("INT16", -32769), ("UINT8", 256),
                                            ("UINT16", 70000)])
def test_narrow_int_contents_must_fit(datatype: str, value: int) -> None:
    field_name = "uint_contents" if datatype.startswith("U") else "int_contents"
    contents = pb.InferTensorContents(**{field_name: [0, value]})
    with pytest.raises(ShoalError, match=r"values must be integers in \["):
        typed_contents_bytes(contents, datatype, "X", "m")


def test_contents_together_with_raw_contents_are_refused() -> None:
    message = raw_request()
    message.inputs[0].contents.fp32_contents.extend([1.0, 2.0])
    fails(message, "contents field must not be specified when using raw_input_contents for "
                   "'A' for model 'm'")


def test_an_input_without_data_is_refused() -> None:
    message = request(inputs=[tensor("A", "FP32", [1]), tensor("B", "INT32", [1])],
                      raw_input_contents=[b"\0" * 4])
    fails(message, "unable to find data for input tensor 'B' for model 'm' in request.")


def test_raw_contents_beyond_the_inputs_are_refused() -> None:
    message = raw_request()
    message.raw_input_contents.append(b"extra")
    fails(message, "unexpected additional input data for model 'm'")


def test_bad_datatype_and_negative_dims_are_named() -> None:
    # Triton's core reads an unknown datatype as <invalid>
    fails(request(inputs=[tensor("A", "FP128", [1])], raw_input_contents=[b""]),
          "[request id: <id_unknown>] inference input 'A' data-type is '<invalid>', but model "
          "'m' expects 'FP32'")
    fails(request(inputs=[tensor("Z", "FP128", [1])], raw_input_contents=[b""]),
          "unexpected inference input 'Z' for model 'm'")
    fails(request(inputs=[tensor("A", "FP32", [-1])], raw_input_contents=[b""]),
          "Unable to parse 'shape' for input 'A'")


# ------------------------------------------------------------------------ shared memory


def shm_params(**values: Any) -> dict[str, Any]:
    params = {}
    for key, value in values.items():
        kind = "string_param" if isinstance(value, str) else "int64_param"
        params[f"shared_memory_{key}"] = pb.InferParameter(**{kind: value})
    return params


def test_shared_memory_input_and_output_references() -> None:
    message = request(
        inputs=[tensor("A", "FP32", [2], parameters=shm_params(region="r", offset=8,
                                                               byte_size=8))],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(
            name="OUTPUT0", parameters=shm_params(region="o", byte_size=16))])
    decoded = decode_model_infer_request(message, MODEL).request
    assert decoded.inputs[0].shm == SharedMemorySlice("r", 8, 8)
    assert decoded.outputs[0].shm == SharedMemorySlice("o", 0, 16)
    assert len(decoded.inputs[0].data) == 0


@pytest.mark.parametrize("params,text", [
    (shm_params(region="r"), "'shared_memory_byte_size' must be specified along with"),
    (shm_params(byte_size=4), "'shared_memory_byte_size' can not be specified without"),
    (shm_params(region=3, byte_size=4), "'shared_memory_region' parameter for tensor 'A', "
                                        "expected string_param."),
    (shm_params(region="r", byte_size="4"), "'shared_memory_byte_size' parameter for tensor "
                                            "'A', expected int64_param."),
])
def test_shared_memory_parameters_follow_tritons_rules(params: dict[str, Any],
                                                       text: str) -> None:
    fails(request(inputs=[tensor("A", "FP32", [1], parameters=params)]), text)


def test_shared_memory_input_with_contents_is_refused() -> None:
    message = request(inputs=[tensor("A", "FP32", [1], parameters=shm_params(
        region="r", byte_size=4), contents=pb.InferTensorContents(fp32_contents=[1.0]))])
    fails(message, "unexpected 'content' provided when using shared memory for input tensor "
                   "'A' for model 'm'")


def test_shared_memory_byte_size_is_validated_like_data() -> None:
    message = request(inputs=[
        tensor("A", "FP32", [2], parameters=shm_params(region="r", byte_size=4)),
        tensor("B", "INT32", [2])], raw_input_contents=[b"\0" * 8])
    decoded = decode_model_infer_request(message, MODEL).request
    with pytest.raises(ShoalError, match=r"input byte size mismatch for input 'A' for model "
                                         r"'m'. Expected 8, got 4"):
        validate_request(decoded, MODEL)


def test_shared_memory_output_cannot_be_classified() -> None:
    message = raw_request()
    output = message.outputs.add(name="OUTPUT0", parameters=shm_params(region="o",
                                                                       byte_size=4))
    output.parameters["classification"].int64_param = 1
    fails(message, "Output 'OUTPUT0' can't set both 'shared_memory_region' and "
                   "'classification'")


def test_validation_uses_the_http_messages() -> None:
    message = request(inputs=[tensor("A", "FP32", [2])], raw_input_contents=[b"\0" * 8])
    with pytest.raises(ShoalError, match=r"expected 2 inputs but got 1 inputs for model 'm'"):
        validate_request(decode_model_infer_request(message, MODEL).request, MODEL)


# ------------------------------------------------------------------------ parameters


def params(**values: Any) -> dict[str, Any]:
    return {key: pb.InferParameter(**{kind: value}) for key, (kind, value) in values.items()}


def test_reserved_parameters_set_the_request_fields() -> None:
    message = raw_request()
    for key, param in params(sequence_id=("int64_param", 42), sequence_start=("bool_param", True),
                             sequence_end=("bool_param", True), priority=("uint64_param", 2),
                             timeout=("int64_param", 1500)).items():
        message.parameters[key].CopyFrom(param)
    decoded = decode_model_infer_request(message, MODEL).request
    assert decoded.correlation_id == 42
    assert decoded.flags == SEQUENCE_START | SEQUENCE_END
    assert (decoded.priority, decoded.timeout_us) == (2, 1500)
    assert decoded.parameters == {}


def test_string_sequence_id_and_custom_parameters_pass_through() -> None:
    message = raw_request()
    for key, param in params(sequence_id=("string_param", "seq"), a=("int64_param", -3),
                             b=("bool_param", False), c=("string_param", "x"),
                             d=("double_param", 0.5), e=("uint64_param", 2**64 - 1)).items():
        message.parameters[key].CopyFrom(param)
    decoded = decode_model_infer_request(message, MODEL).request
    assert decoded.correlation_id == "seq"
    assert decoded.parameters == {"a": -3, "b": False, "c": "x", "d": 0.5, "e": 2**64 - 1}


@pytest.mark.parametrize("value,expected", [(5, 5), (-1, 2**64 - 1), (-(2**63), 2**63)])
def test_an_int64_sequence_id_is_taken_as_its_uint64_bits(value: int, expected: int) -> None:
    message = raw_request()
    message.parameters["sequence_id"].int64_param = value
    assert decode_model_infer_request(message, MODEL).request.correlation_id == expected


def test_a_uint64_sequence_id_is_refused_like_triton() -> None:
    message = raw_request()
    message.parameters["sequence_id"].uint64_param = 6
    fails(message, "invalid value type for 'sequence_id' parameter, expected int64_param or "
                   "string_param.")


def test_a_string_sequence_id_over_128_bytes_is_unsupported() -> None:
    message = raw_request()
    message.parameters["sequence_id"].string_param = "é" * 64  # 128 bytes: accepted
    assert decode_model_infer_request(message, MODEL).request.correlation_id == "é" * 64
    message.parameters["sequence_id"].string_param = "x" * 129
    with pytest.raises(ShoalError) as caught:
        decode_model_infer_request(message, MODEL)
    assert caught.value.code is ErrorCode.UNSUPPORTED
    assert caught.value.message == "string correlation ID cannot be longer than 128 characters"


@pytest.mark.parametrize("key,kind,value,text", [
    ("priority", "string_param", "1", "expected int64_param or uint64_param."),
    ("priority", "int64_param", -1, "invalid value for 'priority', expected value >= 0."),
    ("timeout", "uint64_param", 5, "'timeout' parameter, expected int64_param."),
    ("sequence_start", "int64_param", 1, "'sequence_start' parameter, expected bool_param."),
    ("sequence_id", "bool_param", True, "expected int64_param or string_param."),
    ("triton_anything", "bool_param", True, "Only the following keys starting with 'triton_' "
                                            "are allowed: triton_enable_empty_final_response"),
    ("triton_enable_empty_final_response", "int64_param", 1, "expected bool_param."),
    ("headers", "string_param", "x", "parameter key 'headers' is reserved"),
])
def test_bad_parameters_are_refused(key: str, kind: str, value: Any, text: str) -> None:
    message = raw_request()
    message.parameters[key].CopyFrom(pb.InferParameter(**{kind: value}))
    fails(message, text)


def test_empty_final_response_flag() -> None:
    message = raw_request()
    assert not decode_model_infer_request(message, MODEL).empty_final_response
    message.parameters["triton_enable_empty_final_response"].bool_param = True
    decoded = decode_model_infer_request(message, MODEL)
    assert decoded.empty_final_response
    assert decoded.request.parameters == {}


def test_output_parameters() -> None:
    message = raw_request()
    output = message.outputs.add(name="OUTPUT0")
    output.parameters["classification"].int64_param = 3
    output.parameters["custom"].string_param = "v"
    decoded = decode_model_infer_request(message, MODEL).request
    assert decoded.outputs[0].classification == 3
    assert decoded.outputs[0].parameters == {"custom": "v"}
    output.parameters["triton_x"].bool_param = True
    fails(message, "reserved for Triton usage and should not be specified (output 'OUTPUT0')")
    del output.parameters["triton_x"]
    output.parameters["classification"].string_param = "3"
    fails(message, "invalid value type for 'classification' parameter, expected int64_param.")
