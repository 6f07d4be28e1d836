"""How the inference service is registered on the grpc.aio server (``grpc/handlers.py``)."""

from __future__ import annotations

from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb

from shoal.frontend.grpc.handlers import SERVICE, add_inference_service
from shoal.frontend.grpc.wire import parse_infer_request


class _Servicer:
    """Every RPC name resolves to a handler coroutine."""

    def __getattr__(self, name: str) -> Any:
        async def method(request: Any, context: Any) -> None:
            return None

        return method


class _RecordingServer:
    def __init__(self) -> None:
        self.generic: list[Any] = []
        self.registered: list[Any] = []

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        self.registered.append((service, handlers))


def _details(method: str) -> Any:
    class Details(grpc.HandlerCallDetails):  # type: ignore[misc]
        pass

    details = Details()
    details.method = method
    details.invocation_metadata = ()
    return details


def test_one_generic_handler_serves_every_rpc_and_no_registered_methods() -> None:
    # registered methods would make grpc.aio wait on one pending task per method for every
    # call it accepts (the module's note)
    server = _RecordingServer()
    add_inference_service(_Servicer(), server)
    assert server.registered == []
    [handler] = server.generic
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        found = handler.service(_details(f"/{SERVICE}/{method.name}"))
        assert found is not None, method.name
        assert found.request_streaming == method.client_streaming
        assert found.response_streaming == method.server_streaming
    infer = handler.service(_details(f"/{SERVICE}/ModelInfer"))
    assert infer.request_deserializer is parse_infer_request
    assert handler.service(_details(f"/{SERVICE}/NoSuchMethod")) is None
