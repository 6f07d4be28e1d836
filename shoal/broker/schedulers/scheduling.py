"""The one protocol the broker loop schedules every model version through (docs/architecture.md
§5): ``RuntimeScheduling``. Three implementations, chosen by the model's config at load:

* ``QueueScheduling`` over a ``Scheduler`` (``base.py``: the default scheduler or the dynamic
  batcher): any idle instance takes the next batch;
* ``SequenceScheduling`` (``sequence/scheduling.py``, direct and oldest): each instance runs the
  sequences pinned to it, with control tensors and implicit state;
* ``IterativeScheduling`` over an ``IterativeScheduler`` (``iterative.py``): rescheduled requests
  go back to their instance first.

An ensemble has no scheduling of its own: its steps are submitted to their composing models'
(``ensemble/driver.py``). How the loop drives one:

    on a request:        rejection = scheduling.submit(key, request, queued, now)
    on every wake-up:    scheduling.expire(now); for each idle instance i (``has_work`` first
                         when a rate limiter decides): work = scheduling.work_for(i, batch, now)
    on a BatchResult:    scheduling.reschedule(i, requests) for those the model rescheduled;
                         scheduling.done(batch, now, written)
    on a cancel:         ended = scheduling.cancel(key, now) (queued requests it ended)
    on a worker's death: ended = scheduling.fail_instance(i, batch, now)
    then sleep until     scheduling.deadline(now)

All are pure state machines driven by the loop's clock (no I/O but the state store's shm).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from shoal.broker.schedulers.base import QueuedRequest, Rejection, RequestKey, Scheduler
from shoal.broker.schedulers.iterative import IterativeScheduler
from shoal.errors import ShoalError
from shoal.messages import InferRequest, InlineTensor, StateBinding, WrittenState

WrittenStates = Callable[[], Mapping[RequestKey, Sequence[WrittenState]]]  # asked when needed


@dataclass(slots=True)
class Work:
    """One execution to send: the request keys in ``requests`` order; for a sequence batch also
    the Batch ``rows`` (index into those keys, -1 = not ready), the control tensors and each
    key's state bindings (None: none). ``error`` set: the execution cannot run (no memory for
    its state) and is already over for the scheduling; the loop fails its requests and sends
    nothing. Read-only by contract; not frozen, as one is built per dispatch."""

    keys: list[RequestKey]
    rows: list[int] | None = None
    controls: list[InlineTensor] | None = None
    states: dict[RequestKey, list[StateBinding]] | None = None
    error: ShoalError | None = None


class RuntimeScheduling(Protocol):
    # True: an instance with no work says nothing of the others (work is pinned to instances)
    per_instance: bool

    def submit(self, key: RequestKey, request: InferRequest, queued: QueuedRequest,
               now: float) -> Rejection | None: ...

    def has_work(self, instance: int, now: float) -> bool: ...

    def work_for(self, instance: int, batch_id: int, now: float) -> Work | None: ...

    def reschedule(self, instance: int, requests: list[QueuedRequest]) -> list[RequestKey]:
        """The model released these with RESCHEDULE: returns those it cannot run again (all
        of them for a model that is not an iterative sequence)."""
        ...

    def done(self, batch_id: int, now: float, written: WrittenStates) -> None: ...

    def expire(self, now: float) -> list[Rejection]: ...

    def deadline(self, now: float) -> float | None: ...

    def cancel(self, key: RequestKey, now: float) -> list[RequestKey]:
        """A request not yet dispatched was cancelled: the queued requests that end with it."""
        ...

    def fail_instance(self, instance: int, batch_id: int | None, now: float
                      ) -> list[RequestKey]:
        """The worker of ``instance`` died (running ``batch_id``, None: idle): the requests
        waiting here that end with it."""
        ...

    def drain(self) -> list[RequestKey]: ...

    def close(self) -> None: ...


class QueueScheduling:
    """A ``Scheduler`` (one queue for every instance) as ``RuntimeScheduling``."""

    per_instance = False

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def submit(self, key: RequestKey, request: InferRequest, queued: QueuedRequest,
               now: float) -> Rejection | None:
        return self.scheduler.submit(queued, now)

    def has_work(self, instance: int, now: float) -> bool:
        return self.scheduler.has_batch(now)

    def work_for(self, instance: int, batch_id: int, now: float) -> Work | None:
        batch = self.scheduler.next_batch(now)
        return Work([q.key for q in batch]) if batch else None

    def reschedule(self, instance: int, requests: list[QueuedRequest]) -> list[RequestKey]:
        return [q.key for q in requests]

    def done(self, batch_id: int, now: float, written: WrittenStates) -> None:
        pass

    def expire(self, now: float) -> list[Rejection]:
        return self.scheduler.expire(now)

    def deadline(self, now: float) -> float | None:
        return self.scheduler.next_deadline(now)

    def cancel(self, key: RequestKey, now: float) -> list[RequestKey]:
        return [key] if self.scheduler.cancel(key) is not None else []

    def fail_instance(self, instance: int, batch_id: int | None, now: float
                      ) -> list[RequestKey]:
        return []  # the queue is every instance's: what waits there runs on another

    def drain(self) -> list[RequestKey]:
        return [q.key for q in self.scheduler.drain()]

    def close(self) -> None:
        pass


class IterativeScheduling(QueueScheduling):
    """An ``IterativeScheduler`` as ``RuntimeScheduling``: work is pinned to instances once
    rescheduled."""

    per_instance = True

    def __init__(self, scheduler: IterativeScheduler) -> None:
        super().__init__(scheduler)
        self.iterative = scheduler

    def has_work(self, instance: int, now: float) -> bool:
        return self.iterative.has_batch_for(instance)

    def work_for(self, instance: int, batch_id: int, now: float) -> Work | None:
        batch = self.iterative.next_batch_for(instance, now)
        return Work([q.key for q in batch]) if batch else None

    def reschedule(self, instance: int, requests: list[QueuedRequest]) -> list[RequestKey]:
        self.iterative.reschedule(instance, requests)
        return []

    def fail_instance(self, instance: int, batch_id: int | None, now: float
                      ) -> list[RequestKey]:
        return [q.key for q in self.iterative.take_rescheduled(instance)]
