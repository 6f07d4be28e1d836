"""``inference.ModelInferRequest`` -> the transport-neutral ``DecodedRequest`` the HTTP path uses
(pure; no I/O), so gRPC requests go through the same validation (``http/validation.py``) with the
same messages.

Tensor data comes from ``raw_input_contents`` (parallel to the inputs that have neither typed
contents nor shared memory, Triton's rule; given apart from the message when
``wire.parse_infer_request`` split them out as views of the received bytes), from typed
``InferTensorContents`` (converted to the wire bytes, little-endian; narrowing int/uint contents
must fit the datatype), or from a
client-registered shared-memory region (``shared_memory_*`` parameters; resolved later by the
registry). Parameters follow Triton's gRPC rules (``SetInferenceRequestMetadata``): reserved keys go
to their request fields, ``triton_*`` keys are refused except
``triton_enable_empty_final_response``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from shoal import dtypes
from shoal.errors import ShoalError, invalid_arg
from shoal.frontend.core.decoded import (
    SEQUENCE_END,
    SEQUENCE_START,
    UINT64_MAX,
    DecodedInput,
    DecodedRequest,
    OutputRequest,
    add_output_parameter,
    checked_element_count,
    string_correlation_id,
)
from shoal.frontend.core.shm_params import (
    SHM_BYTE_SIZE,
    SHM_KEYS,
    SHM_OFFSET,
    SHM_REGION,
    SharedMemorySlice,
    check_output_shm,
)
from shoal.frontend.core.validation import datatype_mismatch, tagged, unexpected_input
from shoal.messages import ModelVersionInfo, ParamValue

EMPTY_FINAL_RESPONSE: Final = "triton_enable_empty_final_response"
_ALLOWED_TRITON_PARAMETERS: Final = (EMPTY_FINAL_RESPONSE,)

# typed contents field -> (the datatype Triton names for it, numpy dtype of its elements)
_CONTENT_FIELDS: Final[dict[str, tuple[str, str]]] = {
    "bool_contents": ("BOOL", "?"),
    "int_contents": ("INT32", "<i4"),
    "int64_contents": ("INT64", "<i8"),
    "uint_contents": ("UINT32", "<u4"),
    "uint64_contents": ("UINT64", "<u8"),
    "fp32_contents": ("FP32", "<f4"),
    "fp64_contents": ("FP64", "<f8"),
    "bytes_contents": ("BYTES", "O"),
}
# int_contents / uint_contents also carry the narrower integer types
_NARROW: Final = {"int_contents": ("INT8", "INT16"), "uint_contents": ("UINT8", "UINT16")}


@dataclass(slots=True)
class DecodedGrpcRequest:
    request: DecodedRequest
    empty_final_response: bool = False  # triton_enable_empty_final_response


def parameter_value(param: Any) -> ParamValue | None:
    """An InferParameter's value (None when no member of the oneof is set)."""
    kind = param.WhichOneof("parameter_choice")
    return None if kind is None else getattr(param, kind)  # type: ignore[no-any-return]


def decode_model_infer_request(message: Any, model: ModelVersionInfo,
                               raw: Sequence[bytes | memoryview] | None = None
                               ) -> DecodedGrpcRequest:
    """Raises ShoalError (INVALID_ARG) on the first problem; validation against the model's
    metadata is the HTTP path's ``validate_request``. ``raw``: the request's raw_input_contents
    when they are not in ``message`` (None: the message's own)."""
    decoded = DecodedGrpcRequest(DecodedRequest(inputs=[], client_id=message.id,
                                                binary_output_default=True))
    _decode_request_parameters(message.parameters, decoded)
    decoded.request.inputs = _decode_inputs(
        message, message.raw_input_contents if raw is None else raw, model)
    decoded.request.outputs = [_decode_output(output) for output in message.outputs]
    return decoded


# ------------------------------------------------------------------------ request parameters


def _decode_request_parameters(parameters: Any, decoded: DecodedGrpcRequest) -> None:
    request = decoded.request
    for key, param in parameters.items():
        kind = param.WhichOneof("parameter_choice")
        value = parameter_value(param)
        if key == "sequence_id":
            # Triton's rule: int64_param (taken as its uint64 bits: -1 is 2^64-1) or
            # string_param; uint64_param and the rest are refused
            if kind == "string_param" and isinstance(value, str):
                request.correlation_id = string_correlation_id(value)
            elif kind == "int64_param" and isinstance(value, int):
                request.correlation_id = value & UINT64_MAX
            else:
                raise invalid_arg("invalid value type for 'sequence_id' parameter, expected "
                                  "int64_param or string_param.")
        elif key in ("sequence_start", "sequence_end"):
            if kind != "bool_param":
                raise invalid_arg(f"invalid value type for '{key}' parameter, expected "
                                  "bool_param.")
            if value:
                request.flags |= SEQUENCE_START if key == "sequence_start" else SEQUENCE_END
        elif key == "priority":
            if kind not in ("int64_param", "uint64_param"):
                raise invalid_arg("invalid value type for 'priority' parameter, expected "
                                  "int64_param or uint64_param.")
            request.priority = _non_negative(value, key)
        elif key == "timeout":
            if kind != "int64_param":
                raise invalid_arg("invalid value type for 'timeout' parameter, expected "
                                  "int64_param.")
            request.timeout_us = _non_negative(value, key)
        elif key.startswith("triton_"):
            _decode_triton_parameter(key, kind, value, decoded)
        elif key == "headers":
            raise invalid_arg(f"parameter key '{key}' is reserved and should not be specified.")
        elif key != "binary_data_output":  # meaningless over gRPC (outputs are always raw)
            request.parameters[key] = _custom_parameter(key, value)


def _non_negative(value: ParamValue | None, key: str) -> int:
    if not isinstance(value, int) or value < 0:
        raise invalid_arg(f"invalid value for '{key}', expected value >= 0.")
    return value


def _decode_triton_parameter(
    key: str, kind: str | None, value: ParamValue | None, decoded: DecodedGrpcRequest
) -> None:
    if key not in _ALLOWED_TRITON_PARAMETERS:
        raise invalid_arg(
            "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
            "following keys starting with 'triton_' are allowed: "
            + " ".join(_ALLOWED_TRITON_PARAMETERS)
        )
    if kind != "bool_param":
        raise invalid_arg(f"invalid value type for '{key}' parameter, expected bool_param.")
    decoded.empty_final_response = bool(value)


def _no_value_message(key: str) -> str:
    return (f"invalid value type for '{key}' parameter, expected int64_param, bool_param, "
            "string_param, double_param or uint64_param.")


def _custom_parameter(key: str, value: ParamValue | None) -> ParamValue:
    if value is None:
        raise invalid_arg(_no_value_message(key))
    return value


# ------------------------------------------------------------------------ inputs


def _invalid_datatype(client_id: str, name: str, model: ModelVersionInfo) -> ShoalError:
    """What Triton's core says of a datatype it does not know (it reads it as ``<invalid>``)."""
    expected = next((spec.datatype for spec in model.inputs if spec.name == name), None)
    if expected is None:
        return unexpected_input(name, model.name)
    return tagged(datatype_mismatch(name, "<invalid>", model.name, expected), client_id)


def _decode_inputs(message: Any, raw: Sequence[bytes | memoryview],
                   model: ModelVersionInfo) -> list[DecodedInput]:
    model_name = model.name
    next_raw = 0
    inputs: list[DecodedInput] = []
    for tensor in message.inputs:
        name = tensor.name
        datatype = tensor.datatype
        if not dtypes.is_datatype(datatype):
            raise _invalid_datatype(message.id, name, model)
        shape = _shape(list(tensor.shape), name)
        count = checked_element_count(shape, name)
        shm = _shared_memory_ref(tensor)
        has_contents = tensor.HasField("contents")
        if shm is not None:
            if has_contents:
                raise invalid_arg(
                    f"unexpected 'content' provided when using shared memory for input tensor "
                    f"'{name}' for model '{model_name}'"
                )
            data = memoryview(b"")
        elif has_contents:
            if len(raw):
                raise invalid_arg(
                    f"contents field must not be specified when using raw_input_contents for "
                    f"'{name}' for model '{model_name}'"
                )
            data = typed_contents_bytes(tensor.contents, datatype, name, model_name)
        elif next_raw < len(raw):
            data = memoryview(raw[next_raw])
            next_raw += 1
        else:
            raise invalid_arg(
                f"unable to find data for input tensor '{name}' for model '{model_name}' in "
                "request."
            )
        inputs.append(DecodedInput(name, datatype, shape, data, count, shm))
    if next_raw < len(raw):
        raise invalid_arg(f"unexpected additional input data for model '{model_name}'")
    return inputs


def _shape(dims: list[int], name: str) -> list[int]:
    if any(d < 0 for d in dims):
        raise invalid_arg(
            f"Unable to parse 'shape' for input '{name}': expected an array of non-negative "
            f"integers, got {dims!r}"
        )
    return dims


def typed_contents_bytes(
    contents: Any, datatype: str, name: str, model_name: str
) -> memoryview:
    """InferTensorContents -> the tensor's wire bytes. Exactly one field may hold data, and it
    must be the one for ``datatype`` (Triton's messages)."""
    present = [f for f in _CONTENT_FIELDS if len(getattr(contents, f))]
    if not present:
        return memoryview(b"")
    if len(present) > 1:
        raise invalid_arg(
            f"unexpected explicit tensor data for input tensor '{name}' for model "
            f"'{model_name}', binary data was already supplied."
        )
    field_name = present[0]
    given, element_dtype = _CONTENT_FIELDS[field_name]
    if datatype in _NARROW.get(field_name, ()):
        given = datatype
    if given != datatype:
        raise invalid_arg(
            f"unexpected explicit tensor data for input tensor '{name}' for model "
            f"'{model_name}' of type '{given}', expected datatype '{datatype}'"
        )
    values = getattr(contents, field_name)
    if datatype == "BYTES":
        return memoryview(dtypes.serialize_bytes(values))
    array = np.fromiter(values, dtype=np.dtype(element_dtype), count=len(values))
    target: np.dtype[Any] = dtypes.numpy_dtype(datatype)
    if target != array.dtype:  # INT8/INT16/UINT8/UINT16 from 32-bit contents
        info = np.iinfo(target)
        if array.size and (int(array.min()) < info.min or int(array.max()) > info.max):
            raise invalid_arg(
                f"unexpected explicit tensor data for input tensor '{name}' for model "
                f"'{model_name}': values must be integers in [{info.min}, {info.max}] for "
                f"datatype {datatype}"
            )
        array = array.astype(target)
    return memoryview(array.view(np.uint8))  # type: ignore[arg-type]


def _shared_memory_ref(tensor: Any) -> SharedMemorySlice | None:
    """Triton's ParseSharedMemoryParams: region (string) and byte size (int64) together, offset
    (int64) optional; None when the tensor does not use shared memory."""
    params = tensor.parameters
    name = tensor.name
    if SHM_REGION not in params:
        for key in (SHM_OFFSET, SHM_BYTE_SIZE):
            if key in params:
                raise invalid_arg(f"'{key}' can not be specified without "
                                  f"'{SHM_REGION}' parameter for tensor '{name}'")
        return None
    region = params[SHM_REGION]
    if region.WhichOneof("parameter_choice") != "string_param":
        raise invalid_arg(f"invalid value type for '{SHM_REGION}' parameter for tensor "
                          f"'{name}', expected string_param.")
    if SHM_BYTE_SIZE not in params:
        raise invalid_arg(f"'{SHM_BYTE_SIZE}' must be specified along with '{SHM_REGION}' "
                          f"parameter for tensor '{name}'")
    sizes = []
    for key in (SHM_OFFSET, SHM_BYTE_SIZE):
        param = params.get(key)
        if param is None:
            sizes.append(0)
            continue
        if param.WhichOneof("parameter_choice") != "int64_param":
            raise invalid_arg(f"invalid value type for '{key}' parameter for tensor '{name}', "
                              "expected int64_param.")
        sizes.append(param.int64_param)
    return SharedMemorySlice(region.string_param, sizes[0], sizes[1])


# ------------------------------------------------------------------------ outputs


def _decode_output(tensor: Any) -> OutputRequest:
    name = tensor.name
    output = OutputRequest(name, shm=_shared_memory_ref(tensor))
    for key, param in tensor.parameters.items():
        value = parameter_value(param)
        if key == "classification":
            if param.WhichOneof("parameter_choice") != "int64_param":
                raise invalid_arg("invalid value type for 'classification' parameter, "
                                  "expected int64_param.")
            output.classification = _non_negative(value, key)
        elif key not in SHM_KEYS and key != "binary_data":
            if value is None and not key.startswith("triton_"):  # no oneof member set
                raise invalid_arg(f"{_no_value_message(key)} (output '{name}')")
            add_output_parameter(output, key, value)
    check_output_shm(output.name, output.shm, output.classification)
    return output
