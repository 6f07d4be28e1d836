"""The frontend process: HTTP, gRPC (and metrics) servers over one FrontendDataPlane.

Entry: ``python -m shoal.frontend <settings JSON> <index> <broker pid>``. STOP_SIGNAL (from the
supervisor) starts a graceful exit: health turns 503, new requests are refused, in-flight
requests finish (bounded by --exit-timeout-secs), then the servers stop and the input arena is
unlinked. The broker's exit (its pid watched through a pidfd, ``BrokerClient.watch_broker``)
ends every request and stream in flight at once with an UNAVAILABLE error naming the broker;
the supervisor then stops the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import os
import socket
import sys
from collections.abc import Generator
from typing import Any, Final

import uvicorn
import uvloop

from shoal.frontend.core.dataplane_impl import FrontendDataPlane
from shoal.frontend.core.log_settings import LogSettings, ProcessLogSettings
from shoal.frontend.http.app import create_asgi_app
from shoal.frontend.http.guard import HttpLimits, guarded_protocol
from shoal.frontend.http.restricted import restrict_metrics_app
from shoal.frontend.limits import (
    log_descriptor_budget,
    plan_descriptor_budget,
    raise_descriptor_limit,
)
from shoal.frontend.metrics import create_metrics_app
from shoal.frontend.restricted import RestrictedApis
from shoal.ops.dashboard import dashboard_routes
from shoal.ops.sampler import Sampler
from shoal.process.lifecycle import (
    STOP_SIGNAL,
    die_with_parent,
    hold_instance_lock,
    ignore_group_signals,
    setup_logging,
)
from shoal.process.ports import port_free, port_in_use_message
from shoal.settings import FrontendSettings
from shoal.trace.config import TraceConfig
from shoal.trace.sampling import Tracer

logger = logging.getLogger(__name__)

GRPC_STOP_GRACE_S: Final = 1.0  # after the drain: calls still open (idle streams) then end
METRICS_OVER_CAP: Final = 8  # metrics-port connections past its cap answered 503 at once
# Young-generation collection threshold (Python's default: 700). The requests in flight hold
# ~15 tracked objects each: at c=64 the live young objects hover around 700, so the default
# collected every few requests (1135 collections, 0.24 s CPU in a 6 s JSON c=64 run, ~8 us a
# request); at 10 000 only real garbage triggers one (10 collections, 0.03 s).
GC_YOUNG_THRESHOLD: Final = 10_000


class _Server(uvicorn.Server):
    """uvicorn server whose signals are handled by us (graceful drain), not by uvicorn."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def reuse_port_socket(host: str, port: int, reuse_port: bool = True) -> socket.socket:
    """A listening socket that several frontend processes can bind (the kernel spreads
    connections across them); ``reuse_port`` False: this process's alone (metrics)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _server(app: object, host: str, port: int, verbose: int, limits: HttpLimits) -> _Server:
    """A uvicorn server whose connections are GuardedHttpProtocol (header and body timeouts,
    connection cap, body size from the headers; the idle keep-alive timeout too)."""
    config = uvicorn.Config(app, host=host, port=port, access_log=verbose > 1,  # type: ignore[arg-type]
                            log_level="debug" if verbose > 1 else "warning", lifespan="off",
                            http=guarded_protocol(limits), ws="none")
    return _Server(config)


def _http_limits(settings: FrontendSettings, max_connections: int, over_cap: int) -> HttpLimits:
    return HttpLimits(header_timeout_s=settings.http.header_timeout_secs,
                      body_timeout_s=settings.http.body_timeout_secs,
                      idle_timeout_s=settings.http.idle_timeout_secs,
                      max_body_bytes=settings.http.max_input_size,
                      max_connections=max_connections, over_cap=over_cap)


async def _start_grpc(dataplane: FrontendDataPlane, settings: FrontendSettings,
                      log_settings: ProcessLogSettings, max_connections: int,
                      tracer: Tracer) -> Any:
    """The gRPC server, started (None with --allow-grpc=false)."""
    if not settings.grpc.enabled:
        return None
    from shoal.frontend.grpc.server import create_grpc_server

    try:
        server = create_grpc_server(dataplane, settings, log_settings, max_connections, tracer)
    except SystemExit:
        if port_free(settings.grpc.address, settings.grpc.port):
            raise
        raise SystemExit(port_in_use_message("gRPC", settings.grpc.address,
                                             settings.grpc.port)) from None
    await server.start()
    return server


async def serve_frontend(settings: FrontendSettings, index: int = 0,
                         broker_pid: int | None = None) -> None:
    """``broker_pid``: the broker process to watch (None: not watched, in-process tests)."""
    fds_before, fd_limit = raise_descriptor_limit()
    budget = plan_descriptor_budget(fd_limit, settings, settings.metrics.enabled and index == 0)
    log_descriptor_budget(fds_before, budget, settings)
    dataplane = FrontendDataPlane(settings, index)
    if broker_pid is not None:
        dataplane.client.watch_broker(broker_pid)
    await dataplane.start()
    # a change through the logging API holds server-wide: the broker and the workers follow
    log_settings = ProcessLogSettings(
        LogSettings.starting(settings),
        on_change=lambda updated: dataplane.client.set_log_level(updated.python_level()))
    # the process's trace settings and sampling, shared by HTTP and gRPC
    tracer = Tracer(TraceConfig.from_triples(settings.trace_config), index, settings.http.workers)
    servers = [_server(create_asgi_app(dataplane, settings, log_settings, tracer),
                       settings.http.address,
                       settings.http.port, settings.log.verbose,
                       _http_limits(settings, budget.http_connections, budget.over_cap))]
    listening = [("HTTP", settings.http.address, settings.http.port, True)]
    sampler: Sampler | None = None  # the one ops sampler: frontend 0, beside /metrics
    if settings.metrics.enabled and index == 0:
        sampler = Sampler(dataplane, settings.instance.instance_id)
        metrics_app = restrict_metrics_app(create_metrics_app(dataplane,
                                                              dashboard_routes(sampler)),
                                           RestrictedApis(settings.http.restricted_apis))
        metrics_address = settings.metrics.address or settings.http.address
        servers.append(_server(metrics_app, metrics_address,
                               settings.metrics.port, settings.log.verbose,
                               _http_limits(settings, budget.metrics_connections,
                                            METRICS_OVER_CAP)))
        listening.append(("metrics", metrics_address, settings.metrics.port, False))
    http_sockets: list[socket.socket] = []  # one per server, bound here: errors name the holder
    for what, address, port, reuse_port in listening:
        try:
            http_sockets.append(reuse_port_socket(address, port, reuse_port))
        except OSError as exc:
            for sock in http_sockets:
                sock.close()
            await dataplane.close()
            raise SystemExit(_listen_error(what, address, port, exc)) from None

    async def drain_then_stop() -> None:
        dataplane.begin_exit()
        try:
            await asyncio.wait_for(dataplane.drained.wait(), settings.exit_timeout_secs)
        except TimeoutError:
            logger.warning("exit timeout expired with %d requests in flight",
                           dataplane.client.in_flight)
        for server in servers:
            server.should_exit = True

    gc.collect()
    gc.freeze()  # start-up objects never die: keep them out of every later collection
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    loop = asyncio.get_running_loop()
    drain_task: list[asyncio.Task[None]] = []
    ignore_group_signals()
    parent = os.getppid()
    grpc_server = None
    grpc_stopping: list[asyncio.Task[None]] = []

    def on_stop_signal() -> None:
        if os.getppid() != parent and not grpc_stopping:  # orphaned: the supervisor died
            grpc_stopping.append(stop_listening(servers, http_sockets, grpc_server, settings))
        if not drain_task:
            drain_task.append(asyncio.create_task(drain_then_stop()))

    loop.add_signal_handler(STOP_SIGNAL, on_stop_signal)
    try:
        grpc_server = await _start_grpc(dataplane, settings, log_settings,
                                        budget.grpc_connections, tracer)
        if sampler is not None:
            sampler.start()
        await asyncio.gather(*(s.serve(sockets=[sock]) for s, sock in zip(servers, http_sockets,
                                                                           strict=True)))
    finally:
        if sampler is not None:
            await sampler.stop()
        if grpc_server is not None:
            await grpc_server.stop(GRPC_STOP_GRACE_S)
        tracer.close()  # after the drain: the last traces are written, the file finished
        await dataplane.close()
    if any(not s.started for s in servers):
        raise SystemExit(f"could not listen on port {settings.http.port} or "
                         f"{settings.metrics.port}")


def stop_listening(servers: list[_Server], http_sockets: list[socket.socket], grpc_server: Any,
                   settings: FrontendSettings) -> asyncio.Task[None]:
    """The supervisor died: close the listening sockets now, so that a new server can bind the
    ports at once; connections already open are served until the drain ends (gRPC: the calls
    in flight get the exit timeout). Returns the task that stops gRPC."""
    logger.warning("the supervisor died: closing the listening ports, then draining")
    for server in servers:
        for listener in getattr(server, "servers", []):
            listener.close()
    for sock in http_sockets:
        sock.close()

    async def stop_grpc() -> None:
        if grpc_server is not None:
            await grpc_server.stop(settings.exit_timeout_secs)

    return asyncio.create_task(stop_grpc())


def _listen_error(what: str, address: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return port_in_use_message(what, address, port)
    return f"cannot listen for {what} on {address}:{port}: {exc}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    settings = FrontendSettings.from_json(args[0])
    setup_logging(settings, "frontend")
    hold_instance_lock(settings)
    die_with_parent(STOP_SIGNAL)
    index = int(args[1]) if len(args) > 1 else 0
    broker_pid = int(args[2]) if len(args) > 2 else None
    uvloop.run(serve_frontend(settings, index, broker_pid))
    return 0
