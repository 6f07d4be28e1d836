"""The broker's side of the worker connection: one ROUTER socket that every worker's DEALERs
connect to, and the live worker processes by identity, each with the model version and
instance slot it serves. A worker's pidfd is registered with the loop's poller, so its death
wakes the loop (``exited``). Single-threaded: the broker loop.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import zmq

from shoal.broker.health import overdue
from shoal.broker.model_runtime import InstanceSlot, ModelVersionRuntime
from shoal.broker.pool import WorkerHandle, WorkerState
from shoal.broker.router import bind_router, drain_router
from shoal.messages import Message, WorkerShutdown, encode

logger = logging.getLogger(__name__)

WorkerEntry = tuple[WorkerHandle, ModelVersionRuntime, InstanceSlot]
STREAM_SUFFIX = "#s"  # identity suffix of a worker's stream socket (decoupled responses)
CONTROL_SUFFIX = "#c"  # identity suffix of a worker's control socket (cancellation, forgets)


class WorkerLink:
    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], endpoint: str,
                 poller: zmq.Poller) -> None:
        self.endpoint = endpoint
        self.socket = bind_router(context, endpoint)
        self.entries: dict[str, WorkerEntry] = {}  # identity -> what the worker serves
        self._by_pidfd: dict[int, str] = {}
        self._poller = poller
        poller.register(self.socket, zmq.POLLIN)

    def add(self, handle: WorkerHandle, runtime: ModelVersionRuntime, slot: InstanceSlot) -> None:
        self.entries[handle.identity] = (handle, runtime, slot)
        if handle.pidfd is not None:
            self._by_pidfd[handle.pidfd] = handle.identity
            self._poller.register(handle.pidfd, zmq.POLLIN)

    def remove(self, identity: str) -> WorkerEntry:
        """Forget an exited worker (KeyError if unknown)."""
        entry = self.entries.pop(identity)
        pidfd = entry[0].pidfd
        if pidfd is not None:
            self._poller.unregister(pidfd)
            self._by_pidfd.pop(pidfd, None)
        return entry

    def pidfds(self) -> list[int]:
        """The pidfds registered with the loop's poller."""
        return list(self._by_pidfd)

    def exited(self, polled: object) -> str | None:
        """The identity of the worker whose pidfd ``polled`` is, if it is one."""
        return self._by_pidfd.get(polled) if isinstance(polled, int) else None

    def receive(self) -> Iterator[tuple[WorkerEntry, Message]]:
        """Every message waiting now from known workers (others and malformed ones dropped)."""
        for identity, message in drain_router(self.socket, "worker"):
            name = identity.decode()
            entry = self.entries.get(name.removesuffix(STREAM_SUFFIX).removesuffix(CONTROL_SUFFIX))
            if entry is not None:
                yield entry, message

    def send(self, identity: str, message: Message) -> None:
        try:
            self.socket.send_multipart([identity.encode(), *encode(message)])
        except zmq.ZMQError as exc:
            logger.warning("cannot reach worker %s: %s", identity, exc)

    def send_control(self, identity: str, message: Message) -> None:
        """``message`` to the control socket of worker ``identity`` (a ready one has it)."""
        self.send(identity + CONTROL_SUFFIX, message)

    def send_control_to_all(self, message: Message) -> None:
        """``message`` to the control socket of every worker the broker knows (one still loading
        has no control socket yet and gets nothing: it holds nothing the message could be about).
        """
        for identity in self.entries:
            self.send(identity + CONTROL_SUFFIX, message)

    def stop_instances(self, slots: list[InstanceSlot], kill: bool) -> None:
        """Stop the workers of a retiring model version: idle ones are told to exit (they
        finalize the model); loading ones, and busy ones when ``kill``, are killed (their
        requests fail when the broker sees the exit). No slot restarts. Idempotent."""
        for slot in slots:
            slot.restart_at = None
            handle = slot.worker
            if handle is None or handle.state is WorkerState.DEAD:
                continue
            if handle.state is WorkerState.LOADING or (kill and handle.state is not
                                                       WorkerState.IDLE):
                if handle.process.poll() is None:
                    handle.process.kill()
                handle.state = WorkerState.STOPPING
            elif handle.state is WorkerState.IDLE:
                handle.state = WorkerState.STOPPING
                self.send(handle.identity, WorkerShutdown("model unloaded"))

    def kill_overdue(self, now: float, heartbeat_timeout_s: float) -> None:
        """Kill every worker that is silent or overdue (``health.overdue``), once; the exit
        (seen through its pidfd) then fails what it held, naming ``kill_reason``."""
        for handle, runtime, slot in list(self.entries.values()):
            reason = overdue(handle, now, heartbeat_timeout_s, runtime.execution_timeout_s)
            if reason is None or handle.kill_reason:
                continue
            handle.kill_reason = reason
            logger.error("model %s version %d instance %s (pid %d): %s; killing it",
                         runtime.name, runtime.version, slot.instance_name, handle.pid, reason)
            if handle.process.poll() is None:
                handle.process.kill()

    def close(self) -> None:
        self.socket.close(linger=0)
