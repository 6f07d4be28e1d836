"""``BlsClient``: BLS and model control for one worker process, on the worker's behalf.

Nothing is created until the first use (a model that never calls BLS pays nothing): then the BLS
input arena (``<arena_prefix>b<n>`` segments: the broker removes every segment of the worker's
``arena_prefix`` when the worker dies) and the ``BlsLink`` (socket identity ``bls-<identity>``,
``Hello`` first, repository snapshots kept).

Fork: a process forked from the worker (``multiprocessing``) inherits the link's socket but not
its thread, so it could never hear an answer. The child therefore starts afresh on first use: a
new ZeroMQ context, identity ``bls-<identity>~<pid>`` and arena ``<arena_prefix>b~<pid>-<n>`` (the
inherited objects are left untouched: they belong to the parent), closed when a
``multiprocessing`` child exits.

Threads: every public method may be called from any thread. The arena is guarded by
``_arena_lock`` (allocation on the calling thread, frees on the link thread); each input is copied
into its slot on the calling thread, outside the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Final

import zmq

from shoal.errors import ErrorCode, ShoalError
from shoal.messages import LoadModel, RepositorySnapshot, UnloadModel, WorkerSpec
from shoal.settings import WorkerSettings
from shoal.shm.arena import Arena, Slot
from shoal.workers.bls.link import BlsLink, PendingCall, Sink
from shoal.workers.bls.memory import BlsAnswer, CalleeMemory
from shoal.workers.bls.requests import (
    BlsCall,
    build_request,
    check_call,
    failed_call,
    model_ready,
    place_inputs,
    resolve_model,
)

SNAPSHOT_TIMEOUT_S: Final = 10.0
CONTROL_TIMEOUT_S: Final = 600.0  # a load runs to the end (READY or failed) before it answers


class BlsStream:
    """The answers of one call, in order; the last one is ``final``. ``next`` blocks."""

    def __init__(self, cancel: Callable[[int, bool], None]) -> None:
        self._cancel = cancel
        self._answers: queue.SimpleQueue[BlsAnswer] = queue.SimpleQueue()
        self.request_id = 0

    def put(self, answer: BlsAnswer) -> None:
        self._answers.put(answer)

    def next(self) -> BlsAnswer:
        return self._answers.get()

    def cancel(self) -> None:
        """The callee is asked to stop (a queued request ends at once with CANCELLED; a running
        one sees ``is_cancelled()``); its answers keep coming until the final one."""
        if self.request_id:
            self._cancel(self.request_id, False)

    def abandon(self) -> None:
        """Nobody reads any more: cancel, and later answers only give their memory back."""
        if self.request_id:
            self._cancel(self.request_id, True)


class BlsClient:
    def __init__(self, spec: WorkerSpec, settings: WorkerSettings,
                 context: zmq.Context[zmq.Socket[bytes]]) -> None:
        self._identity = f"bls-{spec.identity}".encode()
        self._arena_prefix = spec.arena_prefix + "b"
        self._settings = settings
        self._context = context
        self._lock = threading.Lock()        # lazy creation and close
        self._arena_lock = threading.Lock()  # the arena is not thread-safe
        self._arena: Arena | None = None
        self._link: BlsLink | None = None
        self._closed = False
        self._request_ids = itertools.count(1)
        self._query_ids = itertools.count(1)
        self._inherited: list[Any] = []  # a forked child's copies of the parent's link and arena
        this = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forked(this))

    def _after_fork(self) -> None:
        """In a forked child: forget (never touch) the parent's link, arena and context, so the
        next use connects anew under names of this process."""
        pid = os.getpid()
        self._inherited += [self._link, self._arena, self._context]
        self._lock = threading.Lock()  # another thread may have held them at the fork
        self._arena_lock = threading.Lock()
        self._link, self._arena = None, None
        self._context = zmq.Context()
        base = self._identity.decode().split("~", 1)[0]
        self._identity = f"{base}~{pid}".encode()
        self._arena_prefix = f"{self._arena_prefix.split('~', 1)[0]}~{pid}-"
        if not self._closed:
            import multiprocessing.util
            multiprocessing.util.Finalize(self, self.close, exitpriority=10)

    @property
    def started(self) -> bool:
        return self._link is not None

    def _connected(self) -> BlsLink:
        with self._lock:
            if self._closed:
                raise ShoalError(ErrorCode.UNAVAILABLE, "the worker is shutting down")
            if self._link is None:
                settings = self._settings
                self._arena = Arena(self._arena_prefix, settings.shm.segment_bytes,
                                    settings.shm.arena_max_bytes)
                memory = CalleeMemory(settings.instance.segment_prefix, settings.shm.segment_bytes,
                                      max(settings.shm.arena_max_bytes // 2, 1))
                self._link = BlsLink(self._context, f"ipc://{settings.instance.runtime_dir}/frontend.sock",
                                     self._identity, memory)
            return self._link

    def snapshot(self) -> RepositorySnapshot:
        return self._connected().wait_snapshot(SNAPSHOT_TIMEOUT_S)

    # ------------------------------------------------------------------ inference

    def start(self, call: BlsCall, sink: Sink) -> int:
        """Check, place the inputs and send the call; ``sink`` gets every answer on the link
        thread. Raises ShoalError (Triton's wording) when the request cannot leave."""
        try:
            link = self._connected()
            info = resolve_model(link.wait_snapshot(SNAPSHOT_TIMEOUT_S), call.model, call.version)
            batch_size = check_call(call, info)
        except ShoalError as exc:
            raise failed_call(call.model, exc) from None
        slots: list[Slot] = []
        try:
            refs = place_inputs(call.inputs, self._allocate, slots)
            request_id = next(self._request_ids)
            request = build_request(request_id, call, info, refs, batch_size)
            deadline = (time.monotonic() + call.timeout_us / 1e6) if call.timeout_us > 0 else None
            link.submit(PendingCall(request, sink, lambda: self._free(slots), deadline))
        except BaseException as exc:
            self._free(slots)
            if isinstance(exc, ShoalError):
                raise failed_call(call.model, exc) from None
            if isinstance(exc, ValueError | TypeError):  # an input numpy cannot write as typed
                raise failed_call(call.model, ShoalError(ErrorCode.INVALID_ARG, str(exc))) from None
            raise
        return request_id

    def call(self, call: BlsCall) -> BlsAnswer:
        """One answer (blocks): the callee's, or an error (never raises for the call's own
        failures)."""
        answers: queue.SimpleQueue[BlsAnswer] = queue.SimpleQueue()
        try:
            self.start(call, answers.put)
        except ShoalError as exc:
            return BlsAnswer.failed(exc.code, exc.message)
        return answers.get()

    def call_async(self, call: BlsCall) -> asyncio.Future[BlsAnswer]:
        """Like ``call`` on the running event loop: the answer is set from the link thread with
        ``call_soon_threadsafe``; cancelling the future cancels the request."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[BlsAnswer] = loop.create_future()

        def settle(answer: BlsAnswer) -> None:
            if not future.done():
                future.set_result(answer)

        def hand_over(answer: BlsAnswer) -> None:  # link thread
            loop.call_soon_threadsafe(settle, answer)

        try:
            request_id = self.start(call, hand_over)
        except ShoalError as exc:
            future.set_result(BlsAnswer.failed(exc.code, exc.message))
            return future
        future.add_done_callback(
            lambda f: self.cancel(request_id, abandon=True) if f.cancelled() else None)
        return future

    def cancel(self, request_id: int, abandon: bool = False) -> None:
        """Ask the broker to cancel a call (``abandon``: nobody reads its answers any more).
        Quietly nothing once the client is closed."""
        link = self._link
        if link is not None:
            with contextlib.suppress(ShoalError):
                link.cancel(request_id, abandon)

    def stream(self, call: BlsCall) -> BlsStream:
        """Every answer of the call in order (a failure to send is one final error answer)."""
        stream = BlsStream(self.cancel)
        try:
            stream.request_id = self.start(call, stream.put)
        except ShoalError as exc:
            stream.put(BlsAnswer.failed(exc.code, exc.message))
        return stream

    def _allocate(self, nbytes: int) -> Slot:
        assert self._arena is not None
        with self._arena_lock:
            return self._arena.allocate(nbytes)

    def _free(self, slots: list[Slot]) -> None:
        with self._arena_lock:
            if self._arena is not None:
                for slot in slots:
                    self._arena.free(slot)
        slots.clear()

    # ------------------------------------------------------------------ model control

    def model_ready(self, name: str, version: str = "") -> bool:
        """ValueError for a version string that is not an integer >= 0."""
        return model_ready(self.snapshot(), name, version)

    def load_model(self, name: str, config: str = "", files: dict[str, bytes] | None = None
                   ) -> None:
        """Returns once the model is READY; ShoalError with the server's reason otherwise."""
        self._control(LoadModel(next(self._query_ids), name, config, dict(files or {})))

    def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._control(UnloadModel(next(self._query_ids), name, unload_dependents))

    def _control(self, message: LoadModel | UnloadModel) -> None:
        reply = self._connected().control(message, CONTROL_TIMEOUT_S)
        if reply.error is not None:
            raise ShoalError(reply.error.code, reply.error.message)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop the link (calls still waiting get an error; queued lease releases are sent),
        then unlink the BLS arena. Idempotent."""
        with self._lock:
            self._closed = True
            link, self._link = self._link, None
        if link is not None:
            link.close()
        with self._arena_lock:
            if self._arena is not None:
                self._arena.close()
                self._arena = None


def _forked(client: weakref.ref[BlsClient]) -> None:
    alive = client()
    if alive is not None:
        alive._after_fork()
