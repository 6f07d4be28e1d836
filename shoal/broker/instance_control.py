"""A model instance's state as its worker reports it, and the server's stop (docs/architecture.md
§6): a heartbeat, ready (the slot serves; its failures of loading are forgotten), load failed
(the reason the version shows), and at shutdown every queued request refused and every worker
told to finalize and exit. Bookkeeping on handles, slots and runtimes plus the sends to the
workers; the loop routes the messages and flags what changed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from shoal.broker.dispatcher import FinishError
from shoal.broker.model_runtime import InstanceSlot, ModelVersionRuntime
from shoal.broker.pool import WorkerHandle, WorkerState
from shoal.broker.worker_link import WorkerLink
from shoal.errors import ErrorCode
from shoal.messages import Error, Heartbeat, LogLevel, WorkerShutdown

logger = logging.getLogger(__name__)


def record_heartbeat(handle: WorkerHandle, message: Heartbeat, now: float) -> None:
    handle.heartbeat_at = now
    if message.custom_metrics is not None:
        handle.custom_metrics = message.custom_metrics
    if message.llm is not None:
        handle.llm = message.llm


def mark_ready(handle: WorkerHandle, runtime: ModelVersionRuntime, slot: InstanceSlot,
               now: float, workers: WorkerLink, unwanted: bool, log_level: LogLevel | None
               ) -> bool:
    """The worker loaded its model: it is idle, the slot has served (``ever_ready``), and it
    gets the logging API's last change (``log_level``). ``unwanted`` (the server or the
    version is on its way out): it is told to exit instead; returns False then."""
    if unwanted:
        handle.state = WorkerState.STOPPING
        workers.send(handle.identity, WorkerShutdown("server exiting"))
        return False
    handle.state, handle.ready_at = WorkerState.IDLE, now
    slot.ever_ready, slot.last_exit = True, ""
    slot.gave_up = False  # a slot given up after a crash loop serves again (instance_deaths)
    if log_level is not None:
        workers.send_control(handle.identity, log_level)
    logger.info("model %s version %d instance %s ready (pid %d)", runtime.name,
                runtime.version, slot.instance_name, handle.pid)
    runtime.refresh_state()
    return True


def mark_load_failed(handle: WorkerHandle, runtime: ModelVersionRuntime, slot: InstanceSlot,
                     message: str) -> None:
    """The worker could not load its model; it exits by itself (its exit follows)."""
    slot.last_exit = f"failed to load: {message}"
    runtime.reason = f"model instance '{slot.instance_name}' failed to load: {message}"
    handle.state = WorkerState.STOPPING


def stop_everything(runtimes: Iterable[ModelVersionRuntime], workers: WorkerLink,
                    finish_error: FinishError, now: float) -> None:
    """Shutdown: refuse what is queued, cancel every restart, ask every worker to finalize and
    exit (a loading one is told when its WorkerReady arrives)."""
    error = Error(ErrorCode.UNAVAILABLE, "Server exiting")
    for runtime in runtimes:
        for key in runtime.drain_queue():
            finish_error(runtime, key, error, "OTHER", now)
        for slot in runtime.instances:
            slot.restart_at = None
    for identity, (handle, _runtime, _slot) in workers.entries.items():
        if handle.state is not WorkerState.DEAD:
            loading = handle.state is WorkerState.LOADING
            handle.state = WorkerState.STOPPING
            if not loading:
                workers.send(identity, WorkerShutdown("server exiting"))


def kill_unfinished(workers: WorkerLink) -> list[str]:
    """The shutdown's time is up: SIGKILL every worker still running; returns every identity
    left (the loop then handles each one's exit)."""
    left = list(workers.entries)
    for identity in left:
        handle = workers.entries[identity][0]
        if handle.process.poll() is None:
            logger.warning("worker %s did not exit in time; killing it",
                           handle.spec.instance_name)
            handle.process.kill()
    return left
