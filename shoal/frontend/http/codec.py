"""Decoding a KServe v2 infer request body into a ``DecodedRequest`` (pure; no I/O).

Body layout (binary tensor data extension): the JSON header, then the binary chunks of the inputs
that carry ``parameters.binary_data_size``, in the order those inputs appear in the JSON.
``Inference-Header-Content-Length`` gives the header length; absent, the whole body is JSON;
``0`` makes it a raw binary request (the body is the one input's bytes, Triton's rules).

Every tensor comes out as ``DecodedInput.data``: a flat byte view ('B' format) holding exactly
the bytes that go to shared memory (little-endian, row-major; BYTES in 4-byte-length framing).
Binary inputs are zero-copy views of the body; JSON inputs are converted once here.
"""

from __future__ import annotations

import struct
from typing import Any, Final

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
    custom_parameter,
    request_tag,
    string_correlation_id,
)
from shoal.frontend.core.shm_params import (
    INT64_MAX,
    SHM_KEYS,
    check_output_shm,
    decode_shared_memory,
)
from shoal.frontend.http.json_tensors import json_tensor_bytes, may_hold_booleans
from shoal.frontend.http.jsonparse import parse_json_object
from shoal.messages import ModelVersionInfo

_LENGTH = struct.Struct("<I")
_RESERVED_PARAMETERS: Final = frozenset({"headers"})
_SHM_KEY_SET: Final = frozenset(SHM_KEYS)  # a tensor without them has no shared memory


def split_body(body: memoryview, header_length: str | None) -> tuple[memoryview, memoryview] | None:
    """(json header, binary part) of the body, or None for a raw binary request."""
    if header_length is None:
        return body, body[len(body):]
    try:
        length = int(header_length.strip())
    except ValueError:
        raise invalid_arg(
            f"Unable to parse Inference-Header-Content-Length, got: {header_length}"
        ) from None
    if length == 0:
        return None
    if length < 0 or length > len(body):
        raise invalid_arg(
            f"inference header size should be in range (0, {len(body)}), got: {header_length}"
        )
    return body[:length], body[length:]


def decode_infer_request(
    body: bytes | bytearray | memoryview,
    header_length: str | None,
    model: ModelVersionInfo,
    max_input_bytes: int,
) -> DecodedRequest:
    """The whole body -> DecodedRequest. Raises ShoalError (INVALID_ARG / UNSUPPORTED)."""
    view = memoryview(body).cast("B")
    parts = split_body(view, header_length)
    if parts is None:
        return decode_raw_request(view, model)
    header, binary = parts
    document = parse_json_object(header, "request JSON")
    request = DecodedRequest(inputs=[])
    request_id = document.get("id", "")
    if not isinstance(request_id, str):
        raise invalid_arg("Unable to parse 'id': expected a string")
    request.client_id = request_id
    parameters = document.get("parameters")
    if parameters is not None:
        decode_request_parameters(parameters, request)
    text = body if isinstance(body, bytes | bytearray) and len(body) == len(header) else bytes(
        header)
    request.inputs = _decode_inputs(document.get("inputs"), binary, model.name, max_input_bytes,
                                    len(header), may_hold_booleans(text))
    request.outputs = _decode_outputs(document.get("outputs"))
    return request


def decode_raw_request(body: memoryview, model: ModelVersionInfo) -> DecodedRequest:
    """Raw binary request (header length 0): the model must have exactly one input; its shape is
    [1] + dims (batching) or dims with at most one -1, deduced from the byte size; BYTES needs
    shape [1]. All outputs come back binary. Errors carry Triton's core start for a request
    without an id (``[request id: <id_unknown>] ``)."""
    tag = request_tag("")
    if len(model.inputs) != 1:
        raise invalid_arg(
            f"{tag}Raw request must only have 1 input (found 1) to be deduced but got "
            f"{len(model.inputs)} inputs in '{model.name}' model configuration"
        )
    spec = model.inputs[0]
    shape = [1] if model.max_batch_size > 0 else []
    dynamic_axis = -1
    fixed_count = 1
    for dim in spec.dims:
        if dim == -1:
            if dynamic_axis != -1:
                raise invalid_arg(
                    f"{tag}The shape of the raw input '{spec.name}' can not be deduced because "
                    "there are more than one variable-sized dimension"
                )
            dynamic_axis = len(shape)
        else:
            fixed_count *= dim
        shape.append(dim)
    if spec.datatype == "BYTES":
        if dynamic_axis != -1 or fixed_count != 1:
            raise invalid_arg(
                f"{tag}For BYTE datatype raw input '{spec.name}', the model must have input "
                "shape [1]"
            )
        data = memoryview(_LENGTH.pack(len(body)) + body.tobytes())
    else:
        data = body
        if dynamic_axis != -1:
            unit = fixed_count * dtypes.element_size(spec.datatype)
            shape[dynamic_axis] = len(body) // unit if unit else 0
    tensor = DecodedInput(spec.name, spec.datatype, shape, data, dtypes.element_count(shape))
    return DecodedRequest(inputs=[tensor], binary_output_default=True, raw=True)


# ------------------------------------------------------------------------ request parameters


def _uint(value: Any, limit: int = UINT64_MAX) -> int | None:
    if type(value) is int and 0 <= value <= limit:
        return value
    return None


def decode_request_parameters(value: Any, request: DecodedRequest) -> None:
    """Triton's reserved keys go to their fields; any other str/int/float/bool passes through."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise invalid_arg("Unable to parse 'parameters': expected a JSON object")
    for key, item in value.items():
        if key == "sequence_id":
            if isinstance(item, str):
                request.correlation_id = string_correlation_id(item)
            elif (number := _uint(item)) is not None:
                request.correlation_id = number
            else:
                raise invalid_arg(
                    "Unable to parse 'sequence_id': expected an unsigned integer or a string"
                )
        elif key in ("sequence_start", "sequence_end", "binary_data_output"):
            if not isinstance(item, bool):
                raise invalid_arg(f"Unable to parse '{key}': expected a boolean")
            if key == "binary_data_output":
                request.binary_output_default = item
            elif item:
                request.flags |= SEQUENCE_START if key == "sequence_start" else SEQUENCE_END
        elif key in ("priority", "timeout"):
            number = _uint(item)
            if number is None:
                raise invalid_arg(f"Unable to parse '{key}': expected an unsigned integer")
            if key == "priority":
                request.priority = number
            else:
                request.timeout_us = number
        elif key.startswith("triton_"):
            raise invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage and "
                "should not be specified."
            )
        elif key in _RESERVED_PARAMETERS:
            raise invalid_arg(f"parameter key '{key}' is reserved and should not be specified.")
        else:
            request.parameters[key] = custom_parameter(key, item)


# ------------------------------------------------------------------------ inputs


def _decode_inputs(
    items: Any, binary: memoryview, model_name: str, max_input_bytes: int,
    binary_start: int = 0, booleans: bool = True,
) -> list[DecodedInput]:
    """``binary_start``: where ``binary`` begins in the body (for ``DecodedInput.body_offset``);
    ``booleans`` False: the JSON holds no true / false (``json_tensor_bytes``)."""
    if not isinstance(items, list):
        raise invalid_arg("Unable to parse 'inputs': expected a JSON array")
    decoded: list[DecodedInput] = []
    offset = 0
    total_bytes = 0
    for item in items:
        if not isinstance(item, dict):
            raise invalid_arg("Unable to parse 'inputs': each input must be a JSON object")
        name = item.get("name")
        if not isinstance(name, str):
            raise invalid_arg("Unable to parse 'name' of an input: expected a string")
        datatype = _decode_datatype(item.get("datatype"), name)
        shape = _decode_shape(item.get("shape"), name)
        count = checked_element_count(shape, name)
        params = item.get("parameters", {})
        if not isinstance(params, dict):
            raise invalid_arg(f"Unable to parse 'parameters' for input '{name}'")
        shm = None if _SHM_KEY_SET.isdisjoint(params) else decode_shared_memory(
            params, f"input '{name}'")
        _check_content_fields(name, "data" in item, params)
        declared = _declared_bytes(datatype, count, name, model_name)
        if shm is not None:
            decoded.append(DecodedInput(name, datatype, shape, binary[:0], count, shm))
            continue  # not in the body: the body limits do not apply
        if total_bytes + declared > max_input_bytes:
            raise _tensor_limit_error(total_bytes + declared, max_input_bytes, name)
        if "binary_data_size" in params:
            size = _uint(params["binary_data_size"], INT64_MAX)
            if size is None:
                raise invalid_arg(f"Unable to parse 'binary_data_size' for input '{name}'")
            available = len(binary) - offset
            if size > available:
                raise invalid_arg(
                    f"unexpected size for input '{name}', expecting {size - available} "
                    f"additional bytes for model '{model_name}'"
                )
            data = binary[offset:offset + size]
            body_offset = binary_start + offset
            offset += size
        elif count == 0:  # Triton reads no 'data' for a tensor of no elements
            data, body_offset = binary[:0], -1
        else:
            data = json_tensor_bytes(item["data"], datatype, count, name, booleans)
            body_offset = -1
        total_bytes += declared if datatype != "BYTES" else len(data)
        if total_bytes > max_input_bytes:
            raise _tensor_limit_error(total_bytes, max_input_bytes, name)
        decoded.append(DecodedInput(name, datatype, shape, data, count, None, body_offset))
    if offset != len(binary):
        raise invalid_arg(f"unexpected additional input data for model '{model_name}'")
    return decoded


def _tensor_limit_error(size: int, limit: int, name: str) -> ShoalError:
    return invalid_arg(
        f"input tensor size of {size} bytes (counting input '{name}') exceeds the maximum "
        f"allowed value of {limit} bytes. Use --http-max-input-size to increase the limit."
    )


def _declared_bytes(datatype: str, count: int, name: str, model_name: str) -> int:
    """Byte size implied by the shape (0 for BYTES, whose size is the data's)."""
    if datatype == "BYTES":
        return 0
    nbytes = count * dtypes.element_size(datatype)
    if nbytes > INT64_MAX:
        raise invalid_arg(f"byte size overflow for input '{name}' for model '{model_name}'")
    return nbytes


def _decode_datatype(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise invalid_arg(f"Unable to parse 'datatype' for input '{name}': expected a string")
    if not dtypes.is_datatype(value):
        raise invalid_arg(f"invalid datatype for input {name}")  # Triton's text
    return value


def _decode_shape(value: Any, name: str) -> list[int]:
    if isinstance(value, list):
        for dim in value:
            if type(dim) is not int or dim < 0:
                break
        else:
            return value
    raise invalid_arg(
        f"Unable to parse 'shape' for input '{name}': expected an array of non-negative "
        f"integers, got {value!r}"
    )


def _check_content_fields(name: str, has_data: bool, params: dict[str, Any]) -> None:
    """Exactly one of data / binary_data_size / shared_memory_region (Triton's message)."""
    has_binary = "binary_data_size" in params
    has_shm = "shared_memory_region" in params
    if has_data != has_binary and not has_shm:
        return
    fields = [("data", has_data), ("binary_data_size", has_binary),
              ("shared_memory_region", has_shm)]
    present = [f"'{label}'" for label, found in fields if found]
    if len(present) != 1:
        detail = " no field is set" if not present else " set " + " ".join(present)
        raise invalid_arg(
            "Input must set only one of the following fields: 'data', "
            "'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. "
            f"But{detail}"
        )


# ------------------------------------------------------------------------ outputs


def _decode_outputs(items: Any) -> list[OutputRequest]:
    if items is None:
        return []
    if not isinstance(items, list):
        raise invalid_arg("Unable to parse 'outputs': expected a JSON array")
    outputs: list[OutputRequest] = []
    for item in items:
        if not isinstance(item, dict):
            raise invalid_arg("Unable to parse 'outputs': each output must be a JSON object")
        name = item.get("name")
        if not isinstance(name, str):
            raise invalid_arg("Unable to parse 'name' of an output: expected a string")
        params = item.get("parameters", {})
        if not isinstance(params, dict):
            raise invalid_arg(f"Unable to parse 'parameters' for output '{name}'")
        outputs.append(_decode_output(name, params))
    return outputs


def _decode_output(name: str, params: dict[str, Any]) -> OutputRequest:
    output = OutputRequest(name, shm=None if _SHM_KEY_SET.isdisjoint(params)
                           else decode_shared_memory(params, f"output '{name}'"))
    for key, value in params.items():
        if key == "binary_data":
            if not isinstance(value, bool):
                raise invalid_arg(f"Unable to parse 'binary_data' for output '{name}'")
            output.binary = value
        elif key == "classification":
            count = _uint(value, INT64_MAX)
            if count is None:
                raise invalid_arg(f"Unable to set 'classification' for output '{name}'")
            output.classification = count
        elif key not in SHM_KEYS:
            add_output_parameter(output, key, value)
    check_output_shm(output.name, output.shm, output.classification)
    if output.shm is not None and output.binary:
        raise invalid_arg(f"Output '{name}' can't set both 'shared_memory_region' and "
                          "'binary_data'")
    return output
