"""What a model instance's death means (docs/architecture.md §6): the error its requests get,
the requests that end with it (its running batch, its open streams, and what waited for it
alone), and the slot's restart plan (back-off, or giving up after repeated failures). Pure
bookkeeping on the runtime and slot; the loop answers the requests and spawns the restart.
"""

from __future__ import annotations

from shoal.broker.model_runtime import InstanceSlot, ModelVersionRuntime
from shoal.broker.pool import WorkerHandle, restart_delay
from shoal.broker.schedulers.base import RequestKey
from shoal.errors import ErrorCode
from shoal.messages import Error

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
    gives the slot up (it never became ready, or failed too often). False when the version
    no longer serves at all (its queued requests must fail)."""
    if not slot.last_exit:
        slot.last_exit = description
    served = now - handle.ready_at if handle.ready_at is not None else 0.0
    slot.failures = 0 if served >= _HEALTHY_AFTER_S else slot.failures + 1
    if not slot.ever_ready or runtime.gave_up_on(slot):
        slot.gave_up = True
        runtime.reason = runtime.reason or f"model instance '{slot.instance_name}' " \
                                           f"{slot.last_exit}"
        return runtime.serving()
    slot.restart_at = now + restart_delay(slot.failures - 1, served)
    return True
