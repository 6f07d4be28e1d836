"""Building the frontend's gRPC server: Triton's inference service and the standard health
service on ``--grpc-address:--grpc-port``. grpc binds with SO_REUSEPORT, so every frontend
process (``--http-workers``) can serve the same port; the kernel spreads connections across them.

Limits (``server_options``), all grpc core channel arguments, so they hold without Python code
on the hot path: received messages up to ``--grpc-max-input-size`` (default INT32_MAX, as
Triton; answers may be that large too); ``--grpc-max-connections`` per process (more are closed
at accept); ``--grpc-max-concurrent-streams`` per connection (sent in HTTP/2 SETTINGS: a client
queues its calls past it); Triton's keepalive flags (a client pinging more often than
``--grpc-http2-min-recv-ping-interval-without-data`` with no data in between gets a strike,
and past ``--grpc-http2-max-ping-strikes`` a GOAWAY ENHANCE_YOUR_CALM "too_many_pings");
optional connection idle and age limits (GOAWAY, then clients reconnect).

Not bounded here: the bytes of one HTTP/2 header block. grpc core (1.85) drops metadata past
its 16 KiB hard limit as it arrives (no memory grows) but reads CONTINUATION frames without
end, whatever ``grpc.max_metadata_size`` / ``grpc.absolute_max_metadata_size`` say; only the
idle / age limits end such a connection (README "Faults and limits").

Restricted APIs (``--grpc-restricted-protocol``): an interceptor checks each call's metadata
(``grpc/restricted.py``); every served method must have a category or the server is not built.

The server is created inside the running event loop (grpc.aio uses it) and started by the
caller: ``await server.start()``; ``await server.stop(grace)`` ends it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import grpc

from shoal.frontend.core.log_settings import LogSettings, ProcessLogSettings
from shoal.frontend.grpc.handlers import add_inference_service
from shoal.frontend.grpc.health import health_handler
from shoal.frontend.grpc.restricted import restricted_interceptors
from shoal.frontend.grpc.service import InferenceServicer
from shoal.frontend.restricted import RestrictedApis
from shoal.settings import FrontendSettings

if TYPE_CHECKING:
    from shoal.frontend.core.dataplane import DataPlane
    from shoal.trace.sampling import Tracer

MAX_MESSAGE_BYTES: Final = 2**31 - 1  # INT32_MAX, as Triton and tritonclient use


def server_options(settings: FrontendSettings, max_connections: int | None = None
                   ) -> list[tuple[str, int]]:
    """grpc channel arguments from the settings; ``max_connections`` overrides
    ``--grpc-max-connections`` (the process's descriptor budget may be smaller)."""
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", settings.grpc.max_input_size),
        ("grpc.so_reuseport", 1),
        ("grpc.max_allowed_incoming_connections",
         settings.grpc.max_connections if max_connections is None else max_connections),
        ("grpc.max_concurrent_streams", settings.grpc.max_concurrent_streams),
        ("grpc.keepalive_time_ms", settings.grpc.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", settings.grpc.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(settings.grpc.keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", settings.grpc.http2_max_pings_without_data),
        ("grpc.http2.min_ping_interval_without_data_ms",
         settings.grpc.http2_min_recv_ping_interval_without_data_ms),
        ("grpc.http2.max_ping_strikes", settings.grpc.http2_max_ping_strikes),
    ]
    for name, value in (("grpc.max_connection_idle_ms", settings.grpc.max_connection_idle_ms),
                        ("grpc.max_connection_age_ms", settings.grpc.max_connection_age_ms),
                        ("grpc.max_connection_age_grace_ms",
                         settings.grpc.max_connection_age_grace_ms)):
        if value > 0:  # 0 = none: grpc's default (infinite)
            options.append((name, value))
    return options


def response_compression(settings: FrontendSettings) -> grpc.Compression:
    """``--grpc-infer-response-compression-level``: any level but none answers with gzip (grpc
    compresses only for clients that said they accept it; Python's grpc has no levels)."""
    if settings.grpc.response_compression == "none":
        return grpc.Compression.NoCompression
    return grpc.Compression.Gzip


def server_credentials(settings: FrontendSettings) -> grpc.ServerCredentials | None:
    """``--grpc-use-ssl`` (``-mutual``: clients must present a certificate the root
    certificate signed): TLS credentials from the PEM files; None for plain gRPC. The CLI
    checked that the files exist; an unreadable one raises SystemExit naming it."""
    if not settings.grpc.use_ssl:
        return None

    def read(path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise SystemExit(f"cannot read {path} for gRPC TLS: {exc.strerror}") from None

    root = read(settings.grpc.root_cert) if settings.grpc.root_cert else None
    return grpc.ssl_server_credentials(
        [(read(settings.grpc.server_key), read(settings.grpc.server_cert))],
        root_certificates=root, require_client_auth=settings.grpc.use_ssl_mutual)


def grpc_bind_address(settings: FrontendSettings) -> str:
    host = settings.grpc.address
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 literal
    return f"{host}:{settings.grpc.port}"


def create_grpc_server(
    dataplane: DataPlane, settings: FrontendSettings,
    log_settings: ProcessLogSettings | None = None,
    max_connections: int | None = None, tracer: Tracer | None = None,
) -> Any:
    """A grpc.aio server bound to the configured address (not started). ``log_settings`` are
    the process's, shared with its HTTP endpoint (so is ``tracer``); ``max_connections`` as in
    ``server_options``. Raises SystemExit when the port cannot be bound."""
    if log_settings is None:
        log_settings = ProcessLogSettings(LogSettings.starting(settings))
    interceptors = restricted_interceptors(RestrictedApis(settings.grpc.restricted_protocols))
    server = grpc.aio.server(options=server_options(settings, max_connections),
                             interceptors=interceptors,
                             compression=response_compression(settings))
    servicer = InferenceServicer(dataplane, settings, log_settings, tracer)
    add_inference_service(servicer, server)
    server.add_generic_rpc_handlers((health_handler(dataplane),))
    address = grpc_bind_address(settings)
    try:
        credentials = server_credentials(settings)
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        raise SystemExit(f"could not listen on gRPC address {address}: {exc}") from None
    if port == 0:
        raise SystemExit(f"could not listen on gRPC address {address}")
    return server
