"""The BLS connection of one worker: a DEALER socket to the broker's frontend ROUTER, owned by one
thread (``bls-link``).

Threads: ZMQ sockets are not thread-safe, and BLS calls come from the worker's main thread (a
model's ``execute``), the python backend's event-loop thread (``async_exec``) and any thread a
decoupled model starts. So only the link thread touches the socket, the region cache of the
callees' outputs and the table of calls in flight; every other thread hands it work through
``_outbox`` / ``_releases`` (deques) and wakes it through an eventfd that its poller watches.
Answers go to each call's ``sink``, called on the link thread (sinks only hand over: a queue put,
``loop.call_soon_threadsafe``).

Contract: a call's ``on_end`` (freeing its input slots) runs when the broker's terminal answer
arrives, never earlier, even when the caller stopped waiting (timeout, cancel, abandon): the
callee may be reading the inputs until then. Answers nobody waits for any more only have their
leases released. Lease releases are batched into one ReleaseLeases per wake-up.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from shoal.errors import ErrorCode, ShoalError
from shoal.messages import (
    CancelRequest,
    ControlReply,
    Error,
    Hello,
    InferRequest,
    InferRequestBatch,
    InferResponse,
    InferResponseBatch,
    Lease,
    LoadModel,
    Message,
    ReleaseLeases,
    RepositorySnapshot,
    UnknownMessage,
    UnloadModel,
    decode,
    encode,
)
from shoal.workers.bls.memory import BlsAnswer, CalleeMemory, answer_from

logger = logging.getLogger(__name__)

Sink = Callable[[BlsAnswer], None]
_HWM = 100_000
_IDLE_POLL_MS = 1000
TIMEOUT_MESSAGE = "Request timeout expired"


@dataclass(eq=False)
class PendingCall:
    request: InferRequest
    sink: Sink
    on_end: Callable[[], None]
    deadline: float | None = None  # time.monotonic(); past it the caller gets a timeout error
    abandoned: bool = False        # the caller stopped listening: answers only free memory


@dataclass(frozen=True, slots=True)
class _Cancel:
    request_id: int
    abandon: bool


@dataclass(frozen=True, slots=True)
class _Control:
    message: LoadModel | UnloadModel
    waiter: queue.SimpleQueue[ControlReply]


class BlsLink:
    """Connects at construction and starts the link thread; ``close`` stops it."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], endpoint: str, identity: bytes,
                 memory: CalleeMemory) -> None:
        self._identity = identity
        self._socket = context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.IDENTITY, identity)
        self._socket.setsockopt(zmq.LINGER, 500)
        self._socket.setsockopt(zmq.SNDHWM, _HWM)
        self._socket.setsockopt(zmq.RCVHWM, _HWM)
        self._socket.connect(endpoint)
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._wake_lock = threading.RLock()  # reentrant: a finalizer may wake from inside _wake
        self._outbox: deque[PendingCall | _Cancel | _Control] = deque()
        self._releases: deque[Lease] = deque()
        self._calls: dict[int, PendingCall] = {}
        self._controls: dict[int, queue.SimpleQueue[ControlReply]] = {}
        self._deadlines: list[tuple[float, int]] = []
        self._memory = memory
        self._snapshot: RepositorySnapshot | None = None
        self._snapshot_ready = threading.Event()
        self._closing = False
        self._closed = False  # set by the link thread under _state_lock: nothing is taken now
        # reentrant, as _wake_lock: a finalizer (an abandoned iterator) may hand over from inside
        self._state_lock = threading.RLock()
        self._thread = threading.Thread(target=self._run, name="bls-link", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- any thread

    def wait_snapshot(self, timeout_s: float) -> RepositorySnapshot:
        """The latest repository state the broker pushed (waits for the first one)."""
        if not self._snapshot_ready.wait(timeout_s) or self._snapshot is None:
            raise ShoalError(ErrorCode.UNAVAILABLE, "the server did not answer the BLS "
                                                    "connection")
        return self._snapshot

    def submit(self, call: PendingCall) -> None:
        self._hand_over(call)

    def cancel(self, request_id: int, abandon: bool = False) -> None:
        """Ask the broker to cancel the call; ``abandon``: nobody reads its answers any more."""
        self._hand_over(_Cancel(request_id, abandon))

    def control(self, message: LoadModel | UnloadModel, timeout_s: float) -> ControlReply:
        waiter: queue.SimpleQueue[ControlReply] = queue.SimpleQueue()
        self._hand_over(_Control(message, waiter))
        try:
            return waiter.get(timeout=timeout_s)
        except queue.Empty:
            raise ShoalError(ErrorCode.UNAVAILABLE, f"no answer from the server within "
                                                    f"{timeout_s:.0f} s") from None

    def release(self, lease: Lease) -> None:
        """Give ``lease`` back (any thread, finalizers included: never blocks for long)."""
        self._releases.append(lease)
        self._wake()

    def close(self, timeout_s: float = 2.0) -> None:
        """Pending calls get an error, queued releases are sent, the socket closes."""
        self._closing = True
        self._wake()
        self._thread.join(timeout_s)
        with self._wake_lock:
            if self._wake_fd >= 0 and not self._thread.is_alive():  # its poller watches the fd
                os.close(self._wake_fd)
                self._wake_fd = -1

    def _hand_over(self, item: PendingCall | _Cancel | _Control) -> None:
        with self._state_lock:
            if self._closing or self._closed:
                raise ShoalError(ErrorCode.UNAVAILABLE, "the worker is shutting down")
            self._outbox.append(item)
        self._wake()

    def _wake(self) -> None:
        with self._wake_lock:
            if self._wake_fd >= 0:
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_write(self._wake_fd, 1)

    # ---------------------------------------------------------------- link thread

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._wake_fd, zmq.POLLIN)
        try:
            self._socket.send_multipart(encode(Hello(self._identity.decode())))
            while not self._closing:
                events = dict(poller.poll(self._poll_ms()))
                if self._wake_fd in events:
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(self._wake_fd)
                self._flush()
                if self._socket in events:
                    self._receive()
                self._expire(time.monotonic())
                self._flush()
        except Exception:
            logger.exception("the BLS connection failed")
        finally:
            self._closing = True
            self._shut_down()

    def _poll_ms(self) -> int:
        if not self._deadlines:
            return _IDLE_POLL_MS
        wait = self._deadlines[0][0] - time.monotonic()
        return max(0, min(_IDLE_POLL_MS, int(wait * 1000) + 1))

    def _flush(self) -> None:
        requests: list[InferRequest] = []
        while self._outbox:
            item = self._outbox.popleft()
            if isinstance(item, PendingCall):
                request_id = item.request.request_id
                self._calls[request_id] = item
                if item.deadline is not None:
                    heapq.heappush(self._deadlines, (item.deadline, request_id))
                requests.append(item.request)
                continue
            self._send_requests(requests)  # a cancel must follow the request it names
            if isinstance(item, _Cancel):
                self._cancel(item)
            else:
                self._controls[item.message.query_id] = item.waiter
                self._send(item.message)
        self._send_requests(requests)
        if self._releases:
            leases: list[Lease] = []
            while self._releases:
                leases.append(self._releases.popleft())
            self._send(ReleaseLeases(leases))
            self._memory.given_back(leases)

    def _send_requests(self, requests: list[InferRequest]) -> None:
        if requests:
            self._send(requests[0] if len(requests) == 1 else InferRequestBatch(list(requests)))
            requests.clear()

    def _cancel(self, cancel: _Cancel) -> None:
        call = self._calls.get(cancel.request_id)
        if call is None:
            return
        call.abandoned = call.abandoned or cancel.abandon
        self._send(CancelRequest(cancel.request_id))

    def _send(self, message: Message) -> None:
        self._socket.send_multipart(encode(message))

    def _receive(self) -> None:
        while True:
            try:
                frames = self._socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                message = decode(frames)
            except UnknownMessage as exc:
                logger.warning("dropping a malformed message from the broker: %s", exc)
                continue
            if isinstance(message, InferResponseBatch):
                for response in message.responses:
                    self._on_response(response)
            elif isinstance(message, InferResponse):
                self._on_response(message)
            elif isinstance(message, RepositorySnapshot):
                self._snapshot = message
                self._snapshot_ready.set()
            elif isinstance(message, ControlReply):
                waiter = self._controls.pop(message.query_id, None)
                if waiter is not None:
                    waiter.put(message)

    def _on_response(self, response: InferResponse) -> None:
        call = self._calls.get(response.request_id)
        if call is None or call.abandoned:
            if response.lease is not None:
                self.release(response.lease)
        else:
            answer = answer_from(response, self._memory.view, self.release,
                                 self._memory.copy_bytes)
            self._memory.lent(response.lease, response.outputs)
            self._deliver(call, answer)
        if call is not None and response.final:
            del self._calls[response.request_id]
            call.on_end()

    def _deliver(self, call: PendingCall, answer: BlsAnswer) -> None:
        try:
            call.sink(answer)
        except Exception:
            logger.exception("a BLS answer could not be handed to its caller")

    def _expire(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, request_id = heapq.heappop(self._deadlines)
            call = self._calls.get(request_id)
            if call is None or call.abandoned:
                continue
            self._deliver(call, BlsAnswer.failed(ErrorCode.UNAVAILABLE, TIMEOUT_MESSAGE))
            call.abandoned = True
            self._send(CancelRequest(request_id))

    def _shut_down(self) -> None:
        """Link thread, last: fail what waits, send the releases queued so far, close."""
        with self._state_lock:
            self._closed = True
            left = list(self._outbox)
            self._outbox.clear()
        error = Error(ErrorCode.UNAVAILABLE, "the worker is shutting down")
        for call in [*self._calls.values(), *(i for i in left if isinstance(i, PendingCall))]:
            if not call.abandoned:
                self._deliver(call, BlsAnswer(error=error))
            call.on_end()  # the worker is going away: its arena goes with it
        self._calls.clear()
        for item in left:
            if isinstance(item, _Control):
                item.waiter.put(ControlReply(item.message.query_id, error))
        for query_id, waiter in self._controls.items():
            waiter.put(ControlReply(query_id, error))
        self._controls.clear()
        with contextlib.suppress(zmq.ZMQError):
            if self._releases:
                self._send(ReleaseLeases(list(self._releases)))
        self._memory.close()
        self._socket.close(linger=500)
