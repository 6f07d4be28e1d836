"""The restricted-API gate over gRPC (categories, flags and matching: ``frontend/restricted.py``).

``method_gates`` walks every method the server serves (the generated ``GRPCInferenceService``
descriptor and the standard health service) and gives each one its category's gate from
``GRPC_METHOD_CATEGORIES``; a method without a category is a TypeError, so the server cannot
start with an RPC that a restriction would miss. ``RestrictedProtocolInterceptor`` (installed
only when ``--grpc-restricted-protocol`` restricts something: no cost otherwise) checks the call's
metadata before the method runs: a refused call, unary or streaming (``ModelStreamInfer`` is
refused before any request is read), ends with PERMISSION_DENIED and Triton's text ``This
protocol is restricted, expecting header 'triton-grpc-protocol-<key>'``. (Triton itself answers
UNAVAILABLE, which gRPC clients and proxies treat as retryable; a refusal is not transient.)
Unknown methods pass through to grpc's own UNIMPLEMENTED.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

import grpc
from tritonclient.grpc import service_pb2 as pb

from shoal.frontend.grpc.health import SERVICE_NAME as HEALTH_SERVICE_NAME
from shoal.frontend.restricted import (
    GRPC_METHOD_CATEGORIES,
    RestrictedApis,
    Restriction,
    grpc_refusal_message,
    value_matches,
)

INFERENCE_SERVICE: Final = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
REFUSED_STATUS: Final = grpc.StatusCode.PERMISSION_DENIED


def served_methods() -> list[tuple[str, str]]:
    """(full method path, method name) of every RPC the frontend registers."""
    inference = [(f"/{INFERENCE_SERVICE.full_name}/{m.name}", m.name)
                 for m in INFERENCE_SERVICE.methods]
    return [*inference, (f"/{HEALTH_SERVICE_NAME}/Check", "Check")]


class GrpcGate:
    """One restricted category's check: the first metadata entry named ``key`` must be
    ``value``."""

    def __init__(self, restriction: Restriction) -> None:
        self.restriction = restriction
        self._key = restriction.key
        self._value = restriction.value.encode()
        self.message = grpc_refusal_message(restriction.key)

    def allows(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
        for key, value in metadata or ():
            if key == self._key:
                return value_matches(self._value,
                                     value.encode() if isinstance(value, str) else value)
        return False


def method_gates(restrictions: RestrictedApis,
                 methods: Iterable[tuple[str, str]] | None = None) -> dict[str, GrpcGate]:
    """Full method path -> gate, for the restricted ones. Raises TypeError when a served
    method has no category."""
    gates: dict[str, GrpcGate] = {}
    for path, name in served_methods() if methods is None else methods:
        category = GRPC_METHOD_CATEGORIES.get(name)
        if category is None:
            raise TypeError(f"gRPC method {path} has no API category: add '{name}' to "
                            "GRPC_METHOD_CATEGORIES in shoal/frontend/restricted.py")
        restriction = restrictions.get(category)
        if restriction is not None:
            gates[path] = GrpcGate(restriction)
    return gates


def _refusing(handler: Any, message: str) -> Any:
    """A handler of ``handler``'s kind that ends the call with REFUSED_STATUS at once."""

    async def refuse(request_or_iterator: Any, context: Any) -> None:
        await context.abort(REFUSED_STATUS, message)

    kwargs = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, **kwargs)
    return grpc.unary_unary_rpc_method_handler(refuse, **kwargs)


class RestrictedProtocolInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, gates: Mapping[str, GrpcGate]) -> None:
        self._gates = dict(gates)

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: Any
    ) -> Any:
        handler = await continuation(handler_call_details)
        gate = self._gates.get(handler_call_details.method)
        if gate is None or handler is None or gate.allows(
                handler_call_details.invocation_metadata):
            return handler
        return _refusing(handler, gate.message)


def restricted_interceptors(restrictions: RestrictedApis) -> list[Any]:
    """The server's interceptors: none when nothing is restricted. Always checks that every
    served method has a category (TypeError otherwise)."""
    gates = method_gates(restrictions)
    return [RestrictedProtocolInterceptor(gates)] if gates else []
