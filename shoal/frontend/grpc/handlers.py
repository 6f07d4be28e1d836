"""The method handlers of ``inference.GRPCInferenceService``, as tritonclient's generated
``add_GRPCInferenceServiceServicer_to_server`` builds them (one per RPC of the service
descriptor, protobuf's parse and serialize), except ModelInfer and ModelStreamInfer: their requests
are parsed by ``wire.parse_infer_request`` (large raw inputs stay views of the received bytes)
and their answers are the bytes ``wire.serialize_infer_response`` built (or an in-band error
message), so tensor bytes are not copied by protobuf.

Registered as one generic handler only, not also as registered methods as grpc's generated code
does: grpc.aio's server keeps one pending request task per registered method (20 here) and waits
on all of them with ``asyncio.wait`` for every call it accepts (Python profiler events per
ModelInfer on the frontend's main thread: ~935 with them, ~590 without; the CPU per request
moved less than a paired A/B resolves, ~3%: bench/RESULTS.md "Round three: gRPC frontend").
Clients see no difference: the method names, the handlers and grpc's UNIMPLEMENTED for unknown
methods are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import grpc
from tritonclient.grpc import service_pb2 as pb

from shoal.frontend.grpc.wire import parse_infer_request, serialize_message

SERVICE: Final = "inference.GRPCInferenceService"
_RAW_TENSOR_METHODS: Final = ("ModelInfer", "ModelStreamInfer")


def _handler(method: Any, behaviour: Callable[..., Any]) -> Any:
    request_class = getattr(pb, method.input_type.name)
    response_class = getattr(pb, method.output_type.name)
    deserializer: Callable[[bytes], Any] = request_class.FromString
    serializer: Callable[[Any], bytes] = response_class.SerializeToString
    if method.name in _RAW_TENSOR_METHODS:
        deserializer, serializer = parse_infer_request, serialize_message
    if method.client_streaming and method.server_streaming:
        make = grpc.stream_stream_rpc_method_handler
    elif method.client_streaming:
        make = grpc.stream_unary_rpc_method_handler
    elif method.server_streaming:
        make = grpc.unary_stream_rpc_method_handler
    else:
        make = grpc.unary_unary_rpc_method_handler
    return make(behaviour, request_deserializer=deserializer, response_serializer=serializer)


def method_handlers(servicer: object) -> dict[str, Any]:
    """RPC name -> handler calling ``servicer``'s method of that name, for every RPC."""
    service = pb.DESCRIPTOR.services_by_name[SERVICE.rsplit(".", 1)[1]]
    return {method.name: _handler(method, getattr(servicer, method.name))
            for method in service.methods}


def add_inference_service(servicer: object, server: Any) -> None:
    """Serve ``servicer``'s RPCs on ``server`` (a generic handler; see the module's note)."""
    handlers = method_handlers(servicer)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
