"""An inference answer -> ``inference.ModelInferResponse`` (pure given the output views).

As Triton does, every output's bytes go to ``raw_output_contents`` (parallel to ``outputs``; BYTES
in the 4-byte-length framing), whatever the datatype; an output written to client shared memory
carries its name, datatype and shape and an empty raw entry. Classification outputs become BYTES
``"<value>:<index>"`` tensors, as over HTTP.

The answer goes out as bytes (``grpc/wire.py``): protobuf serializes the small fields and each
output's bytes are copied once, from the worker's segment into those bytes.

Threads: the event loop; the output views must stay valid (lease not yet released) until this
returns — everything is copied into the bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from tritonclient.grpc import service_pb2 as pb

from shoal.frontend.core.classification import classify
from shoal.frontend.core.validation import InferPlan
from shoal.frontend.grpc.wire import serialize_infer_response
from shoal.messages import InferResponse, ParamValue, TensorRef

FINAL_RESPONSE: Final = "triton_final_response"
_INT64_MAX: Final = (1 << 63) - 1


def set_parameter(param: Any, value: ParamValue) -> None:
    """Store a Python value in an InferParameter (its oneof member chosen by type)."""
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        if value > _INT64_MAX:
            param.uint64_param = value
        else:
            param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    else:
        param.string_param = value


def encode_infer_response(
    response: InferResponse,
    *,
    model_name: str,
    model_version: int,
    client_id: str,
    plan: InferPlan,
    batching: bool,
    output_view: Callable[[TensorRef], memoryview],
    final: bool | None = None,
) -> bytes:
    """The serialized ModelInferResponse; with ``final`` (a stream's answer), the serialized
    ModelStreamInferResponse carrying it, marked final or not."""
    message = pb.ModelInferResponse(model_name=model_name, model_version=str(model_version),
                                    id=client_id)
    for key, value in response.parameters.items():
        set_parameter(message.parameters[key], value)
    if final is not None:
        message.parameters[FINAL_RESPONSE].bool_param = final
    raw_outputs: list[bytes | memoryview] = []
    for ref in response.outputs:
        output_plan = plan.output(ref.name)
        if output_plan is None and plan.explicit_outputs:
            continue  # produced but not asked for
        datatype, shape = ref.datatype, list(ref.shape)
        raw: bytes | memoryview
        if output_plan is not None and output_plan.shm is not None:
            raw = b""  # the worker wrote it into the client's region
        elif output_plan is not None and output_plan.classification > 0:
            datatype, shape, raw = classify(ref, output_view(ref), output_plan.classification,
                                            batching)
        else:
            raw = output_view(ref)
        message.outputs.add(name=ref.name, datatype=datatype, shape=shape)
        raw_outputs.append(raw)
    return serialize_infer_response(message, raw_outputs, stream=final is not None)


def stream_error(
    message: str, *, client_id: str, model_name: str, model_version: str, final: bool = True
) -> Any:
    """An in-band error response of the model (Triton's stream handler): ``error_message``, the
    request's id, model name and model version (as the request gave them) and
    ``triton_final_response``."""
    reply = pb.ModelStreamInferResponse(error_message=message)
    infer_response = reply.infer_response
    infer_response.id = client_id
    infer_response.model_name = model_name
    infer_response.model_version = model_version
    infer_response.parameters[FINAL_RESPONSE].bool_param = final
    return reply


def stream_refusal(message: str, *, client_id: str) -> Any:
    """An in-band error for a request refused before it was issued (unknown model, invalid
    input): Triton's stream handler sends ``error_message`` and the request's id only, without
    ``triton_final_response``."""
    reply = pb.ModelStreamInferResponse(error_message=message)
    reply.infer_response.id = client_id
    return reply


def stream_reply(infer_response: Any, final: bool) -> Any:
    """A stream message carrying ``infer_response``, marked final or not."""
    infer_response.parameters[FINAL_RESPONSE].bool_param = final
    return pb.ModelStreamInferResponse(infer_response=infer_response)
