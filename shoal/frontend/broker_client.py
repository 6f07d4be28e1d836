"""The frontend's connection to the broker: one DEALER socket driven from the event loop
(``broker_socket.BrokerSocket``: no Future per message), futures keyed by request id, and the
repository snapshot the broker pushes.

Threads: everything runs on the frontend's asyncio loop. Requests and lease releases are queued
and flushed once per loop iteration: all requests that handlers submitted in one iteration go out
as one InferRequestBatch, carrying that iteration's lease releases too (``releases``); releases
with no request to ride on go as one ReleaseLeases. One socket send per iteration, however many
requests and releases arrived together; a lone request still goes out in the next iteration, so
no latency is added.

The broker's death (``watch_broker``: its pidfd turns readable) ends everything at once: every
pending request and open stream gets a final UNAVAILABLE answer naming it (``BROKER_EXITED``),
statistics and model-control calls raise that error, and every later request is answered so at
once; nothing is sent any more. The supervisor then stops the whole server.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Final

from shoal.errors import ErrorCode, ShoalError
from shoal.frontend.broker_socket import BrokerSocket
from shoal.messages import (
    CacheFigures,
    CancelRequest,
    ClientRegion,
    ControlReply,
    CudaHandle,
    Error,
    ForgetCudaHandles,
    Hello,
    InferRequest,
    InferRequestBatch,
    InferResponse,
    InferResponseBatch,
    Lease,
    LoadModel,
    LogLevel,
    Message,
    RegionRegistered,
    RegionUnregistered,
    ReleaseLeases,
    RepositorySnapshot,
    StatsReply,
    StatsRequest,
    UnknownMessage,
    UnloadModel,
    decode,
    encode,
)

logger = logging.getLogger(__name__)

# Bounded explicitly (never 0 = unbounded): admission control happens in the broker's schedulers,
# this only caps what may sit in the pipe.
_HWM = 100_000
BROKER_EXITED: Final = "the broker exited unexpectedly: the server is stopping"


class _ReleasingQueue(asyncio.Queue[InferResponse]):
    """Stands in for an abandoned stream's queue: gives every answer's memory back."""

    def __init__(self, client: BrokerClient) -> None:
        super().__init__()
        self._client = client

    def put_nowait(self, item: InferResponse) -> None:
        if item.lease is not None:
            self._client.release(item.lease)


def _no_region(region: ClientRegion) -> None:
    pass


class BrokerClient:
    """``frontend_index``: this frontend process's index (-1: none); ``on_region`` gets each
    client region the broker kept for that index, before the first snapshot."""

    def __init__(self, endpoint: str, frontend_id: str,
                 on_snapshot: Callable[[RepositorySnapshot], None], frontend_index: int = -1,
                 on_region: Callable[[ClientRegion], None] = _no_region) -> None:
        self._socket = BrokerSocket(endpoint, frontend_id.encode(), _HWM)
        self._frontend_id = frontend_id
        self._on_snapshot = on_snapshot
        self._frontend_index = frontend_index
        self._on_region = on_region
        self._pending: dict[int, asyncio.Future[InferResponse]] = {}
        # decoupled requests: every answer goes to the queue; on_end runs at the final one
        self._streams: dict[int, tuple[asyncio.Queue[InferResponse], Callable[[], None]]] = {}
        self._stats: dict[int, asyncio.Future[StatsReply]] = {}
        self._controls: dict[int, asyncio.Future[ControlReply]] = {}
        self._releases: list[Lease] = []
        self._outbox: list[InferRequest] = []
        self._flush_scheduled = False
        self._next_query = 1
        self._broker_pidfd: int | None = None
        self._gone: Error | None = None  # set once the broker exited

    @property
    def broker_gone(self) -> bool:
        return self._gone is not None

    @property
    def in_flight(self) -> int:
        return len(self._pending) + len(self._streams)

    async def start(self) -> None:
        self._socket.start(self._on_frames)
        self._send(Hello(self._frontend_id, self._frontend_index))

    def _on_frames(self, frames: list[bytes]) -> None:
        try:
            message = decode(frames)
        except UnknownMessage as exc:
            logger.warning("dropping malformed broker message: %s", exc)
            return
        self._on_message(message)

    def _on_message(self, message: Message) -> None:
        if isinstance(message, InferResponseBatch):
            for response in message.responses:
                self._on_response(response)
        elif isinstance(message, InferResponse):
            self._on_response(message)
        elif isinstance(message, RepositorySnapshot):
            self._on_snapshot(message)
        elif isinstance(message, StatsReply):
            stats = self._stats.pop(message.query_id, None)
            if stats is not None and not stats.done():
                stats.set_result(message)
        elif isinstance(message, ControlReply):
            control = self._controls.pop(message.query_id, None)
            if control is not None and not control.done():
                control.set_result(message)
        elif isinstance(message, RegionRegistered):
            self._on_region(message.region)

    def _on_response(self, response: InferResponse) -> None:
        stream = self._streams.get(response.request_id)
        if stream is not None:
            queue, on_end = stream
            if response.final:
                del self._streams[response.request_id]
                on_end()
            queue.put_nowait(response)
            return
        future = self._pending.pop(response.request_id, None)
        if future is not None and not future.done():
            future.set_result(response)
        elif response.lease is not None:
            self.release(response.lease)

    def watch_broker(self, pid: int) -> None:
        """End everything at once (``broker_exited``) when process ``pid``, the broker, exits
        (its pidfd, read on this loop). No pidfd support: not watched (the supervisor still
        stops the server; requests in flight then wait for the exit timeout)."""
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self.broker_exited()
            return
        except OSError as exc:
            logger.warning("cannot watch the broker (pid %d): %s", pid, exc)
            return
        self._broker_pidfd = fd
        asyncio.get_running_loop().add_reader(fd, self._on_broker_pidfd)

    def _on_broker_pidfd(self) -> None:
        self._unwatch_broker()
        self.broker_exited()

    def _unwatch_broker(self) -> None:
        fd, self._broker_pidfd = self._broker_pidfd, None
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)

    def broker_exited(self) -> None:
        """The broker is gone: every request and stream in flight ends now with a final
        UNAVAILABLE answer (stream consumers' ``on_end`` runs first, as for any final answer);
        pending statistics and control calls raise it. Idempotent."""
        if self._gone is not None:
            return
        error = self._gone = Error(ErrorCode.UNAVAILABLE, BROKER_EXITED)
        logger.error("the broker exited: ending %d requests in flight", self.in_flight)
        self._outbox, self._releases = [], []  # nobody to send them to
        pending, self._pending = self._pending, {}
        for request_id, future in pending.items():
            if not future.done():
                future.set_result(InferResponse(request_id, error=error))
        streams, self._streams = self._streams, {}
        for request_id, (queue, on_end) in streams.items():
            on_end()
            queue.put_nowait(InferResponse(request_id, error=error))
        queries: list[asyncio.Future[StatsReply] | asyncio.Future[ControlReply]] = [
            *self._stats.values(), *self._controls.values()]
        self._stats, self._controls = {}, {}
        for query in queries:
            if not query.done():
                query.set_exception(ShoalError(ErrorCode.UNAVAILABLE, BROKER_EXITED))

    def submit(self, request: InferRequest) -> asyncio.Future[InferResponse]:
        """Queue the request (sent with this iteration's others); the future resolves with the
        broker's terminal answer."""
        future: asyncio.Future[InferResponse] = asyncio.get_running_loop().create_future()
        if self._gone is not None:
            future.set_result(InferResponse(request.request_id, error=self._gone))
            return future
        self._pending[request.request_id] = future
        self._outbox.append(request)
        self._schedule_flush()
        return future

    def submit_stream(self, request: InferRequest, on_end: Callable[[], None]
                      ) -> asyncio.Queue[InferResponse]:
        """Queue the request; every answer (the last one ``final``) lands in the returned
        queue. ``on_end`` runs when the final answer arrives, whoever consumes the queue."""
        queue: asyncio.Queue[InferResponse] = asyncio.Queue()
        if self._gone is not None:
            asyncio.get_running_loop().call_soon(on_end)
            queue.put_nowait(InferResponse(request.request_id, error=self._gone))
            return queue
        self._streams[request.request_id] = (queue, on_end)
        self._outbox.append(request)
        self._schedule_flush()
        return queue

    def abandon_stream(self, request_id: int) -> None:
        """The consumer left: later answers only have their leases released."""
        stream = self._streams.get(request_id)
        if stream is None:
            return
        queue, on_end = stream
        self._streams[request_id] = (_ReleasingQueue(self), on_end)
        while not queue.empty():
            leftover = queue.get_nowait()
            if leftover.lease is not None:
                self.release(leftover.lease)

    def cancel(self, request_id: int) -> None:
        self._flush()  # the request itself must reach the broker first
        self._send(CancelRequest(request_id))

    def forget_cuda_handles(self, handles: list[CudaHandle]) -> None:
        """These CUDA registrations ended and no request uses them any more: the broker passes
        this on to every worker, which unmaps them. Sent after every request queued so far."""
        self._flush()
        self._send(ForgetCudaHandles(handles))

    def set_log_level(self, level: int) -> None:
        """The logging extension's settings changed here: the broker sets its own level and
        every worker's (``LogLevel``)."""
        self._send(LogLevel(level))

    def region_registered(self, region: ClientRegion) -> None:
        """Tell the broker, which keeps it for a frontend that replaces this one."""
        self._send(RegionRegistered(self._frontend_index, region))

    def region_unregistered(self, name: str) -> None:
        self._send(RegionUnregistered(self._frontend_index, name))

    def report_cache_figures(self, figures: CacheFigures) -> None:
        """The response cache's figures (increments); sent at once, so a StatsRequest sent
        after it sees them."""
        self._send(figures)

    def release(self, lease: Lease) -> None:
        if self._gone is not None:
            return  # its worker's segment goes with the instance
        self._releases.append(lease)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        leases = self._releases
        if leases:
            self._releases = []
        if self._outbox:
            requests, self._outbox = self._outbox, []
            if leases:  # one message, not two: the releases ride on the requests
                self._send(InferRequestBatch(requests, leases))
                return
            self._send(requests[0] if len(requests) == 1 else InferRequestBatch(requests))
        if leases:
            self._send(ReleaseLeases(leases))

    async def stats(self, model: str, version: int, timeout_s: float = 10.0,
                    custom_metrics: bool = False) -> StatsReply:
        query_id = self._next_query
        self._next_query += 1
        future: asyncio.Future[StatsReply] = asyncio.get_running_loop().create_future()
        if self._gone is not None:
            raise ShoalError(ErrorCode.UNAVAILABLE, BROKER_EXITED)
        self._stats[query_id] = future
        self._send(StatsRequest(query_id, model, version, custom_metrics))
        try:
            return await asyncio.wait_for(future, timeout_s)
        finally:
            self._stats.pop(query_id, None)

    async def control(self, make: Callable[[int], LoadModel | UnloadModel]) -> ControlReply:
        """Send a model-control command built with a fresh query id; wait for its reply (a load
        answers when it has finished, however long that takes). The reply arrives after the
        snapshot that shows its outcome, so callers see the new state at once."""
        query_id = self._next_query
        self._next_query += 1
        future: asyncio.Future[ControlReply] = asyncio.get_running_loop().create_future()
        if self._gone is not None:
            raise ShoalError(ErrorCode.UNAVAILABLE, BROKER_EXITED)
        self._controls[query_id] = future
        self._send(make(query_id))
        try:
            return await future
        finally:
            self._controls.pop(query_id, None)

    def _send(self, message: Message) -> None:
        # At once below the high-water mark; past it, queued in order (BrokerSocket).
        if self._gone is None:
            self._socket.send(encode(message))

    async def close(self) -> None:
        self._unwatch_broker()
        self._socket.close()
