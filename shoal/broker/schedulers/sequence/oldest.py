"""The ``oldest`` strategy (Triton ``OldestSequenceBatch``).

Sequences are pinned to a slot of an instance as in ``direct`` (``max_candidate_sequences``
slots per instance, default max(1, max_batch_size)), but an execution is not laid out by slot:
each instance has a dynamic batcher (``preferred_batch_size``, ``max_queue_delay_microseconds``;
``preserve_ordering`` is for the broker's ResponseOrderer of that instance) fed with at most one
request per slot. A slot *issues* its front request to the dynamic batcher only when its previous
request has finished (``on_batch_done``), so an execution never holds two requests of one
sequence and each sequence's requests run in order. The queue delay counts from issue, as the
dynamic batcher restamps a request on enqueue. A slot is released when its sequence's END request
is issued; the next sequence in that slot issues after that request finishes (so a new
sequence prefers a free slot with nothing in flight, where Triton takes the lowest free slot).
"""

from __future__ import annotations

from dataclasses import replace

from shoal.broker.schedulers.base import RequestKey
from shoal.broker.schedulers.dynamic import DynamicBatcher, DynamicBatcherConfig
from shoal.broker.schedulers.sequence.batch import BatchRow, SequenceBatch, SequenceReleased
from shoal.broker.schedulers.sequence.core import SequenceBatcherCore
from shoal.broker.schedulers.sequence.records import Slot, Taken
from shoal.broker.schedulers.sequence.requests import SequenceRequest
from shoal.config.sequence_batching import SequenceBatcherConfig


class OldestSequenceBatcher(SequenceBatcherCore):
    """See the package docstring for how the broker drives it. Not thread-safe."""

    def __init__(self, config: SequenceBatcherConfig, instance_count: int) -> None:
        if config.strategy != "oldest":
            raise ValueError("OldestSequenceBatcher needs an oldest-strategy config")
        super().__init__(config, instance_count)
        batcher_config = DynamicBatcherConfig(
            max_batch_size=config.max_batch_size,
            preferred_batch_sizes=config.preferred_batch_sizes,
            max_queue_delay_us=config.max_queue_delay_us,
            preserve_ordering=config.preserve_ordering,
        )
        self._batchers = [DynamicBatcher(batcher_config) for _ in range(instance_count)]
        # Issued (in an instance's dynamic batcher), not yet in an execution: key -> (slot, taken)
        self._issued: dict[RequestKey, tuple[Slot, Taken]] = {}

    def next_batch(self, instance: int, now: float) -> SequenceBatch | None:
        """Called when ``instance`` is idle: its next execution, or None (ask again at
        ``next_deadline`` or after the next submit / completion)."""
        requests = self._batchers[instance].next_batch(now)
        if not requests:
            return None
        taken = [self._issued.pop(request.key)[1] for request in requests]
        released = tuple(serial for t in taken for serial in t.released)
        return SequenceBatch(instance, tuple(t.row for t in taken), None, released)

    def has_batch(self, instance: int, now: float) -> bool:
        """Whether ``next_batch(instance, now)`` would give an execution (nothing is taken)."""
        return self._batchers[instance].has_batch(now)

    def _slot_changed(self, slot: Slot, now: float) -> None:
        self._issue(slot, now)

    def _row_done(self, instance: int, row: BatchRow, now: float) -> None:
        slot = self.slots_of(instance)[row.slot]
        slot.in_flight = False
        self._issue(slot, now)

    def _issue(self, slot: Slot, now: float) -> None:
        """Triton's CompleteAndNext: the slot's front request goes to the dynamic batcher when
        no request of the slot is issued or running. ``in_flight`` is set before taking, so a
        slot refilled from the backlog by that take waits for this request to finish."""
        if slot.in_flight or not slot.queue:
            return
        slot.in_flight = True
        taken = self.take_front(slot, now)
        request = taken.row.request
        assert request is not None
        self._issued[request.key] = (slot, taken)
        rejection = self._batchers[slot.instance].submit(replace(request, arrival=now), now)
        assert rejection is None  # no queue policy: the inner batcher never rejects

    def _strategy_deadline(self, now: float) -> float | None:
        deadlines = [d for b in self._batchers if (d := b.next_deadline(now)) is not None]
        return min(deadlines, default=None)

    def _issued_count(self) -> int:
        return len(self._issued)

    def _cancel_issued(self, key: RequestKey, now: float) -> list[SequenceRequest]:
        """Cancel an issued request: it leaves the dynamic batcher, and its sequence ends."""
        issued = self._issued.pop(key, None)
        if issued is None:
            return []
        slot, taken = issued
        self._batchers[slot.instance].cancel(key)
        sequence = self._running.pop(key)
        sequence.running -= 1
        slot.in_flight = False
        cancelled: list[SequenceRequest] = [self._request_of(taken)]
        later = next((e for e in slot.queue if e.sequence is sequence), None)
        if later is not None:
            cancelled.extend(self._remove_from(later))
        for serial in taken.released:  # freed by the take; nothing will carry them now
            self._outbox.append(SequenceReleased(sequence.correlation_id, slot.instance,
                                                 "cancelled", serial))
        self._end_sequence(sequence, now, "cancelled")
        self._issue(slot, now)
        return cancelled

    def _forget_issued(self, instance: int | None) -> list[SequenceRequest]:
        forgotten: list[SequenceRequest] = []
        for key, (slot, taken) in list(self._issued.items()):
            if instance is None or slot.instance == instance:
                del self._issued[key]
                self._batchers[slot.instance].cancel(key)
                forgotten.append(self._request_of(taken))
                sequence = self._running.pop(key, None)
                if sequence is not None:
                    sequence.running -= 1
        return forgotten

    def _defer_state_release(self, slot: Slot, serial: int) -> bool:
        """A request of ``slot`` still waits in the dynamic batcher and may use ``serial``:
        free it with that request's execution instead of at once."""
        for issued_slot, taken in self._issued.values():
            if issued_slot is slot:
                taken.released.append(serial)
                return True
        return False

    @staticmethod
    def _request_of(taken: Taken) -> SequenceRequest:
        request = taken.row.request
        assert request is not None
        return request
