"""The ``direct`` strategy (Triton ``DirectSequenceBatch::BatcherThread``).

Each live sequence owns one slot of one instance until it ends; slot i is always row i of that
instance's executions. When the instance is idle, an execution covers rows 0..h, h the highest
slot with a queued request: every such slot runs its front request, every other slot below h
runs as a not-ready row (READY false). A slot whose front request's ``shape_signature`` differs
from the first ready slot's also runs as a not-ready row this time (its request waits).

Delay (``max_queue_delay_microseconds`` d, ``minimum_slot_utilization`` u): with d or u zero
the execution starts at once; otherwise it starts when the oldest front request has waited d
(at or after, where Triton needs strictly after), or when ready slots / max(1, max_batch_size)
>= u, whichever comes first.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.broker.schedulers.sequence.batch import BatchRow, SequenceBatch
from shoal.broker.schedulers.sequence.controls import NOT_READY
from shoal.broker.schedulers.sequence.core import SequenceBatcherCore
from shoal.broker.schedulers.sequence.records import Slot
from shoal.broker.schedulers.sequence.requests import SequenceRequest
from shoal.config.sequence_batching import SequenceBatcherConfig


@dataclass(frozen=True, slots=True)
class _Plan:
    """Send rows 0..last now (``send``), or wait until ``wait_until`` (None: nothing queued)."""

    send: bool
    last: int = -1
    first: SequenceRequest | None = None
    wait_until: float | None = None


class DirectSequenceBatcher(SequenceBatcherCore):
    """See the package docstring for how the broker drives it. Not thread-safe."""

    def __init__(self, config: SequenceBatcherConfig, instance_count: int) -> None:
        if config.strategy != "direct":
            raise ValueError("DirectSequenceBatcher needs a direct-strategy config")
        super().__init__(config, instance_count)
        self._delay_s = config.max_queue_delay_us / 1e6
        self._utilization = config.minimum_slot_utilization
        self._max_rows = max(1, config.max_batch_size)

    def next_batch(self, instance: int, now: float) -> SequenceBatch | None:
        """Called when ``instance`` is idle: its next execution, or None (ask again at
        ``next_deadline`` or after the next submit / completion)."""
        slots = self.slots_of(instance)
        plan = self._plan(slots, now)
        if not plan.send or plan.first is None:
            return None
        signature = plan.first.shape_signature
        rows: list[BatchRow] = []
        released: list[int] = []
        for slot in slots[: plan.last + 1]:
            if slot.queue and slot.queue[0].request.shape_signature == signature:
                taken = self.take_front(slot, now)
                rows.append(taken.row)
                released.extend(taken.released)
            else:
                rows.append(BatchRow(slot.index, None, NOT_READY))
        filler = plan.first if any(row.request is None for row in rows) else None
        return SequenceBatch(instance, tuple(rows), filler, tuple(released))

    def has_batch(self, instance: int, now: float) -> bool:
        """Whether ``next_batch(instance, now)`` would give an execution (nothing is taken)."""
        plan = self._plan(self.slots_of(instance), now)
        return plan.send and plan.first is not None

    def _plan(self, slots: list[Slot], now: float) -> _Plan:
        first: SequenceRequest | None = None
        last = -1
        ready = 0
        oldest = float("inf")
        for slot in slots:
            if not slot.queue:
                continue
            front = slot.queue[0].request
            if first is None:
                first = front
            oldest = min(oldest, front.arrival)
            ready += 1
            last = slot.index
        if first is None:
            return _Plan(send=False)
        if self._delay_s == 0 or self._utilization == 0:
            return _Plan(send=True, last=last, first=first)
        deadline = oldest + self._delay_s
        if now >= deadline or ready / self._max_rows >= self._utilization:
            return _Plan(send=True, last=last, first=first)
        return _Plan(send=False, wait_until=deadline)

    def _strategy_deadline(self, now: float) -> float | None:
        waits = [plan.wait_until for slots in self._instances
                 if (plan := self._plan(slots, now)).wait_until is not None]
        return min(waits, default=None)
