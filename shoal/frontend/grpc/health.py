"""The standard gRPC health service (``grpc.health.v1.Health/Check``), as Triton serves it: the
answer is SERVING when the server is ready (``DataPlane.is_ready``), else NOT_SERVING, whatever
service name is asked about.

grpcio-health-checking is not a dependency, so the two tiny messages are coded by hand:
``HealthCheckRequest { string service = 1; }`` and
``HealthCheckResponse { ServingStatus status = 1; }`` (UNKNOWN 0, SERVING 1, NOT_SERVING 2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import grpc

from shoal.errors import invalid_arg

if TYPE_CHECKING:
    from shoal.frontend.core.dataplane import DataPlane

SERVICE_NAME: Final = "grpc.health.v1.Health"
SERVING: Final = 1
NOT_SERVING: Final = 2
_WIRE_VARINT: Final = 0
_WIRE_I64: Final = 1
_WIRE_LEN: Final = 2
_WIRE_I32: Final = 5


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise invalid_arg("malformed HealthCheckRequest")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7


def parse_check_request(data: bytes) -> str:
    """HealthCheckRequest bytes -> its ``service`` (unknown fields are skipped)."""
    service = ""
    position = 0
    while position < len(data):
        key, position = _read_varint(data, position)
        field, wire_type = key >> 3, key & 7
        if wire_type == _WIRE_VARINT:
            _, position = _read_varint(data, position)
        elif wire_type == _WIRE_LEN:
            length, position = _read_varint(data, position)
            if position + length > len(data):
                raise invalid_arg("malformed HealthCheckRequest")
            if field == 1:
                service = data[position:position + length].decode("utf-8", "replace")
            position += length
        elif wire_type in (_WIRE_I64, _WIRE_I32):
            position += 8 if wire_type == _WIRE_I64 else 4
        else:
            raise invalid_arg("malformed HealthCheckRequest")
    return service


def serialize_check_response(status: int) -> bytes:
    """HealthCheckResponse{status} (field 1, varint); status values are below 128."""
    return bytes((0x08, status))


def health_handler(dataplane: DataPlane) -> Any:
    """A grpc generic handler serving ``grpc.health.v1.Health/Check``."""

    async def check(service: str, context: Any) -> int:
        return SERVING if dataplane.is_ready() else NOT_SERVING

    return grpc.method_handlers_generic_handler(SERVICE_NAME, {
        "Check": grpc.unary_unary_rpc_method_handler(
            check,
            request_deserializer=parse_check_request,
            response_serializer=serialize_check_response,
        ),
    })
