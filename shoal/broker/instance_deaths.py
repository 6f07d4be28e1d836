"""What a model instance's death means (docs/architecture.md §6): the error its requests get,
the requests that end with it (its running batch, its open streams, and what waited for it
alone), and the slot's restart plan (back-off; after repeated quick deaths the slot is given up
but still restarted at the capped back-off).
``release_dead_worker`` gives back what the process held (its pidfd, held releases, rate
limiter resources, arena, the leases its BLS calls held); the loop answers the requests and
spawns the restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shoal.broker.dispatcher import Dispatcher, FinishError
from shoal.broker.frontend_link import BLS_PREFIX, FrontendLink
from shoal.broker.held_releases import HeldReleases
from shoal.broker.model_runtime import InstanceSlot, ModelVersionRuntime
from shoal.broker.pool import WorkerHandle, WorkerState, reap, restart_delay
from shoal.broker.schedulers.base import RequestKey
from shoal.broker.worker_link import WorkerEntry, WorkerLink
from shoal.errors import ErrorCode
from shoal.messages import Error
from shoal.shm.sweep import remove_segments_with_prefix

logger = logging.getLogger(__name__)

_HEALTHY_AFTER_S = 60.0  # served this long: the failure count starts again


def death_error(runtime: ModelVersionRuntime, slot: InstanceSlot, handle: WorkerHandle,
                description: str) -> Error:
    return Error(ErrorCode.INTERNAL,
                 f"model instance '{slot.instance_name}' of model '{runtime.name}' version "
                 f"{runtime.version} (pid {handle.pid}) {description} while executing the "
                 "request")


def held_by(runtime: ModelVersionRuntime, slot: InstanceSlot, handle: WorkerHandle, now: float
            ) -> list[RequestKey]:
    """The requests that end with the instance: its running batch, its open decoupled streams,
    and what waited for it alone (sequences without implicit state, rescheduled requests)."""
    keys = runtime.end_batch(handle.batch_id)[0] if handle.batch_id is not None else []
    keys += [runtime.by_exec[e] for e in handle.streams if e in runtime.by_exec]
    keys += runtime.scheduling.fail_instance(runtime.instances.index(slot), handle.batch_id,
                                             now)
    return keys


def plan_restart(runtime: ModelVersionRuntime, slot: InstanceSlot, handle: WorkerHandle,
                 description: str, now: float) -> bool:
    """An unexpected death: records it on the slot and sets its restart time (back-off), or
    gives the slot up when it never became ready (a load failure). A slot that died too often
    in a row (``gave_up_on``) is marked given up too (it will not serve soon: the version's
    queued requests fail and it shows UNAVAILABLE with the reason) but is still restarted, at
    the capped back-off, for as long as the version is served: a crash loop heals by itself
    once its cause is gone, and every give-up is logged. False when the version no longer
    serves at all (its queued requests must fail)."""
    if not slot.last_exit:
        slot.last_exit = description
    served = now - handle.ready_at if handle.ready_at is not None else 0.0
    slot.failures = 0 if served >= _HEALTHY_AFTER_S else slot.failures + 1
    if not slot.ever_ready:
        slot.gave_up = True
        runtime.reason = runtime.reason or f"model instance '{slot.instance_name}' " \
                                           f"{slot.last_exit}"
        return runtime.serving()
    delay = restart_delay(slot.failures - 1, served)
    slot.restart_at = now + delay
    if runtime.gave_up_on(slot):
        slot.gave_up = True
        runtime.reason = (f"model instance '{slot.instance_name}' {slot.last_exit}; it died "
                          f"{slot.failures} times in a row, each within {_HEALTHY_AFTER_S:g} s "
                          f"of its start; trying again in {delay:g} s")
        logger.error("model %s version %d: %s", runtime.name, runtime.version, runtime.reason)
        return runtime.serving()
    return True


def release_dead_worker(identity: str, workers: WorkerLink, held: HeldReleases,
                        dispatcher: Dispatcher, frontends: FrontendLink) -> WorkerEntry:
    """A worker's process exited: forget it and give back what it held; returns what it
    served (its handle, runtime and slot)."""
    entry = workers.remove(identity)
    handle = entry[0]
    reap(handle, timeout=1.0)
    held.drop(identity)  # its arena is removed below
    dispatcher.worker_gone(identity)  # what it held is free; the next tick grants it again
    remove_segments_with_prefix(handle.spec.arena_prefix)
    frontends.caller_gone(BLS_PREFIX + identity.encode())  # leases its BLS calls held
    return entry


def end_instance(handle: WorkerHandle, runtime: ModelVersionRuntime, slot: InstanceSlot,
                 finish_error: FinishError,
                 fail_queued: Callable[[ModelVersionRuntime, float], None], stopping: bool,
                 now: float) -> bool:
    """The dead worker's requests end with its error, the slot is free, and an unexpected
    death plans the restart (or gives the slot up, failing the version's queue when nothing
    serves it any more). True when that changed the slot's state (not for an exit that was
    asked for, at shutdown or for a retiring version)."""
    expected = handle.state is WorkerState.STOPPING and slot.last_exit == ""
    description = handle.exit_description()
    error = death_error(runtime, slot, handle, description)
    for key in held_by(runtime, slot, handle, now):
        finish_error(runtime, key, error, "BACKEND", now)
    handle.state = WorkerState.DEAD
    if slot.worker is handle:
        slot.worker = None
    if stopping or expected or runtime.retiring:
        return False
    logger.error("model %s instance %s (pid %d) %s", runtime.name, slot.instance_name,
                 handle.pid, description)
    if not plan_restart(runtime, slot, handle, description, now):
        fail_queued(runtime, now)  # nothing serves the version any more
    runtime.refresh_state()
    return True
