"""What both strategies share (Triton ``SequenceBatchScheduler``): correlation ids -> sequences,
sequence slots, the backlog, idle release, backlog timeouts, cancellation and implicit state.

A *sequence* here is one incarnation of a correlation id: a START begins one; END (or idle
release, cancellation, a conflicting START, a backlog timeout, instance failure) closes it. At
most one incarnation per id is *live* (accepts requests). Slots are handed out lowest slot
number first, across instances, so every instance's batch grows at the same rate (Triton's
ready_batcher_seq_slots_). A slot is free exactly when the backlog is empty.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping

from shoal.broker.schedulers.base import Rejection, RequestKey
from shoal.broker.schedulers.sequence.batch import (
    BatchRow,
    Notice,
    ReleaseReason,
    SequenceBatch,
    SequenceConflict,
    SequenceReleased,
)
from shoal.broker.schedulers.sequence.controls import RowControl
from shoal.broker.schedulers.sequence.records import Backlog, Entry, SequenceRecord, Slot, Taken
from shoal.broker.schedulers.sequence.requests import (
    CorrelationId,
    SequenceRequest,
    backlog_timed_out,
    check_request,
    conflict_message,
    missing_start,
)
from shoal.broker.schedulers.sequence.state import StateAssignment, StateTracker
from shoal.config.sequence_batching import SequenceBatcherConfig


class SequenceBatcherCore:
    """The strategy-independent half of a sequence batcher. Not thread-safe."""

    def __init__(self, config: SequenceBatcherConfig, instance_count: int) -> None:
        if instance_count < 1:
            raise ValueError("a sequence batcher needs at least one instance")
        self.config = config
        self._instances = [[Slot(i, s) for s in range(config.slots_per_instance)]
                           for i in range(instance_count)]
        self._free: set[tuple[int, int]] = set()  # (slot index, instance) of the free slots
        self._reset_free_slots()
        self._live: dict[CorrelationId, SequenceRecord] = {}
        self._backlogs: deque[Backlog] = deque()
        self._queued: dict[RequestKey, Entry] = {}
        self._running: dict[RequestKey, SequenceRecord] = {}
        self._outbox: list[Notice] = []
        self._states = StateTracker(config.states)
        self._next_serial = 1
        self._idle_s = config.max_sequence_idle_us / 1e6

    # ------------------------------------------------------------------ broker-facing API

    def submit(self, request: SequenceRequest, now: float) -> Rejection | None:
        """Queue ``request`` in its sequence, or say why not (it then never entered). Raises
        ValueError if a request with the same key is queued or running (a broker bug)."""
        rejection = check_request(self.config, request)
        if rejection is not None:
            return rejection
        if request.key in self._queued or request.key in self._running:
            raise ValueError(f"request {request.key!r} is already queued or running")
        live = self._live.get(request.correlation_id)
        if live is None and not request.starts:
            return missing_start(self.config, request)
        sequence = self._start_sequence(request, live, now) if request.starts else live
        assert sequence is not None
        sequence.last_activity = max(sequence.last_activity, now)
        if request.ends:
            sequence.closed = True
            del self._live[request.correlation_id]
        self._enqueue(Entry(request, sequence))
        if isinstance(sequence.place, Slot):
            self._slot_changed(sequence.place, now)
        return None

    def on_batch_done(
        self,
        batch: SequenceBatch,
        now: float,
        unwritten_states: Mapping[int, Collection[str]] | None = None,
    ) -> None:
        """``batch`` finished executing (successfully or not). Swaps the state buffers of its
        rows, except the output states listed per serial in ``unwritten_states`` (the model did
        not write them). Rows already forgotten (instance failure, drain) are ignored."""
        for row in batch.rows:
            if row.request is None:
                continue
            sequence = self._running.pop(row.request.key, None)
            if sequence is None:
                continue
            sequence.running -= 1
            sequence.last_activity = max(sequence.last_activity, now)
            if row.state is not None:
                self._states.swap(row.state.serial, (unwritten_states or {}).get(
                    row.state.serial, ()))
            self._row_done(batch.instance, row, now)

    def expire(self, now: float) -> list[Notice]:
        """Backlogged sequences whose timeout passed (rejections), sequences released as idle,
        and the notices collected since the last call (conflicts, cancellations)."""
        notices: list[Notice] = list(self._expire_backlogs(now))
        for sequence in list(self._live.values()):
            idle_at = self._idle_deadline(sequence)
            if idle_at is not None and now >= idle_at:
                self._end_sequence(sequence, now, "idle")
        notices.extend(self._outbox)
        self._outbox = []
        return notices

    def next_deadline(self, now: float) -> float | None:
        """The earliest time at which ``expire`` or ``next_batch`` may answer differently without
        a new submit or completion; ``now`` when notices wait; None: no such time."""
        if self._outbox:
            return now
        deadlines = [b.deadline for b in self._backlogs if b.deadline is not None]
        for sequence in self._live.values():
            idle_at = self._idle_deadline(sequence)
            if idle_at is not None:
                deadlines.append(idle_at)
        strategy = self._strategy_deadline(now)
        if strategy is not None:
            deadlines.append(strategy)
        return min(deadlines, default=None)

    def cancel(self, key: RequestKey, now: float) -> list[SequenceRequest]:
        """Cancel a queued request: it and the later queued requests of its sequence leave
        (returned, in order; the broker answers them CANCELLED) and the sequence ends, as Triton
        does when a cancelled request reaches the front of its slot. [] if not queued."""
        entry = self._queued.get(key)
        if entry is None:
            return self._cancel_issued(key, now)
        cancelled = self._remove_from(entry)
        self._end_sequence(entry.sequence, now, "cancelled")
        return cancelled

    def fail_instance(self, instance: int, now: float) -> list[SequenceRequest]:
        """The worker of ``instance`` died: its sequences lost their state, so each ends
        (SequenceReleased "instance_failed"); their queued requests are returned for the broker to
        fail; running ones are forgotten (no on_batch_done needed). Freed slots take backlogged
        sequences."""
        failed = self._forget_issued(instance)
        for key, sequence in list(self._running.items()):
            if isinstance(sequence.place, Slot) and sequence.place.instance == instance:
                del self._running[key]
                sequence.running -= 1
        for slot in self._instances[instance]:
            slot.in_flight = False
            if slot.state_serial is not None:
                self._states.release(slot.state_serial)
                slot.state_serial = None
            if slot.holder is None:
                continue
            ended = {id(slot.holder): slot.holder}
            for entry in slot.queue:
                del self._queued[entry.request.key]
                entry.sequence.pending -= 1
                ended[id(entry.sequence)] = entry.sequence
                failed.append(entry.request)
            slot.queue.clear()
            for sequence in ended.values():
                self._close(sequence)
                self._outbox.append(SequenceReleased(
                    sequence.correlation_id, instance, "instance_failed"))
            self._free_slot(slot, now)
        return failed

    def drain(self) -> list[SequenceRequest]:
        """Remove every queued request (unload, shutdown): issued ones first, then slot queues,
        then the backlog. Every sequence and state is forgotten."""
        drained = self._forget_issued(None)
        for slots in self._instances:
            for slot in slots:
                drained.extend(e.request for e in slot.queue)
                slot.queue.clear()
                slot.holder, slot.state_serial, slot.in_flight = None, None, False
        drained.extend(e.request for b in self._backlogs for e in b.entries)
        self._backlogs.clear()
        self._live.clear()
        self._queued.clear()
        self._running.clear()
        self._outbox.clear()
        self._states.clear()
        self._reset_free_slots()
        return drained

    def pending_count(self) -> int:
        """Requests accepted and not yet in an execution."""
        return len(self._queued) + self._issued_count()

    def live_sequences(self) -> int:
        """Sequences that accept requests (started, not ended)."""
        return len(self._live)

    # ------------------------------------------------------------------ strategy hooks

    def _slot_changed(self, slot: Slot, now: float) -> None:
        """A request was queued in ``slot`` or the slot got a backlogged sequence."""

    def _row_done(self, instance: int, row: BatchRow, now: float) -> None:
        """A row of an execution on ``instance`` finished."""

    def _strategy_deadline(self, now: float) -> float | None:
        return None

    def _issued_count(self) -> int:
        return 0

    def _cancel_issued(self, key: RequestKey, now: float) -> list[SequenceRequest]:
        return []

    def _forget_issued(self, instance: int | None) -> list[SequenceRequest]:
        """Drop taken-but-not-dispatched requests of ``instance`` (None: all); return them."""
        return []

    def _defer_state_release(self, slot: Slot, serial: int) -> bool:
        """True when the strategy frees ``serial`` with a later execution of ``slot``."""
        return False

    # ------------------------------------------------------------------ internals

    def _start_sequence(
        self, request: SequenceRequest, live: SequenceRecord | None, now: float
    ) -> SequenceRecord:
        """A new incarnation for a START. A live one is superseded: the new one takes its place
        (slot or backlog) behind the queued requests of the old one (Triton's conflict)."""
        correlation_id = request.correlation_id
        serial, self._next_serial = self._next_serial, self._next_serial + 1
        place: Slot | Backlog
        if live is not None:
            self._outbox.append(SequenceConflict(
                correlation_id, conflict_message(self.config, correlation_id)))
            live.closed = True
            place = live.place
        elif self._free:
            place = self._take_free_slot()
        else:
            place = Backlog()
            self._backlogs.append(place)
        sequence = SequenceRecord(correlation_id, serial, place, now)
        if isinstance(place, Slot):
            place.holder = sequence
        self._live[correlation_id] = sequence
        return sequence

    def _take_free_slot(self) -> Slot:
        """The lowest free slot, preferring one with no request in flight (oldest strategy: a
        slot freed when its END was issued is busy until that END finishes; Triton would wait)."""
        order = sorted(self._free)
        chosen = next((p for p in order if not self._instances[p[1]][p[0]].in_flight), order[0])
        self._free.remove(chosen)
        return self._instances[chosen[1]][chosen[0]]

    def _enqueue(self, entry: Entry) -> None:
        sequence = entry.sequence
        sequence.pending += 1
        self._queued[entry.request.key] = entry
        place = sequence.place
        if isinstance(place, Slot):
            place.queue.append(entry)
            return
        place.entries.append(entry)
        request = entry.request
        if request.timeout_us > 0:
            deadline = request.arrival + request.timeout_us / 1e6
            place.deadline = deadline if place.deadline is None else min(place.deadline, deadline)

    def take_front(self, slot: Slot, now: float) -> Taken:
        """Move the front request of ``slot`` into an execution: its controls, its state buffers
        (initialized when its incarnation's state is not the slot's yet), and the slot's release
        when its holder has nothing more to run (Triton releases a slot at the END request's
        dispatch; the next sequence's requests run in later executions)."""
        entry = slot.queue.popleft()
        request, sequence = entry.request, entry.sequence
        del self._queued[request.key]
        sequence.pending -= 1
        sequence.running += 1
        self._running[request.key] = sequence
        released: list[int] = []
        state: StateAssignment | None = None
        if self._states:
            if slot.state_serial == sequence.serial:
                state = self._states.assignment(sequence.serial)
            else:
                if slot.state_serial is not None:
                    self._states.release(slot.state_serial)
                    released.append(slot.state_serial)
                slot.state_serial = sequence.serial
                state = self._states.begin(sequence.serial)
        holder = slot.holder
        if holder is not None and holder.closed and holder.pending == 0 and not slot.queue:
            if slot.state_serial is not None:
                self._states.release(slot.state_serial)
                released.append(slot.state_serial)
                slot.state_serial = None
            self._free_slot(slot, now)
        row = BatchRow(slot.index, request, RowControl.for_request(request), state)
        return Taken(row, released)

    def _free_slot(self, slot: Slot, now: float) -> None:
        """Give ``slot`` to the oldest backlogged sequence, else mark it free. Deviation from
        Triton: a backlogged sequence's idle time counts from here, not from its last arrival."""
        slot.holder = None
        if not self._backlogs:
            self._free.add((slot.index, slot.instance))
            return
        backlog = self._backlogs.popleft()
        for entry in backlog.entries:
            entry.sequence.place = slot
            entry.sequence.last_activity = max(entry.sequence.last_activity, now)
        slot.queue.extend(backlog.entries)
        slot.holder = backlog.entries[-1].sequence
        self._slot_changed(slot, now)

    def _remove_from(self, entry: Entry) -> list[SequenceRequest]:
        """Remove ``entry`` and the later queued entries of its sequence from its place."""
        sequence = entry.sequence
        place = sequence.place
        queue = place.queue if isinstance(place, Slot) else place.entries
        removed: list[SequenceRequest] = []
        kept: list[Entry] = []
        found = False
        for queued in queue:
            found = found or queued is entry
            if found and queued.sequence is sequence:
                removed.append(queued.request)
                del self._queued[queued.request.key]
                sequence.pending -= 1
            else:
                kept.append(queued)
        queue.clear()
        queue.extend(kept)
        if isinstance(place, Backlog) and not place.entries:
            self._backlogs.remove(place)
        return removed

    def _close(self, sequence: SequenceRecord) -> None:
        sequence.closed = True
        if self._live.get(sequence.correlation_id) is sequence:
            del self._live[sequence.correlation_id]

    def _end_sequence(self, sequence: SequenceRecord, now: float, reason: ReleaseReason) -> None:
        """Close ``sequence`` early; free its slot when nothing of it remains queued."""
        self._close(sequence)
        place = sequence.place
        if isinstance(place, Backlog):
            self._outbox.append(SequenceReleased(sequence.correlation_id, None, reason))
            return
        serial = None
        if place.holder is sequence and sequence.pending == 0 and not place.queue:
            if place.state_serial is not None:
                serial, place.state_serial = place.state_serial, None
                self._states.release(serial)
                if self._defer_state_release(place, serial):
                    serial = None
            self._free_slot(place, now)
        self._outbox.append(SequenceReleased(sequence.correlation_id, place.instance, reason,
                                             serial))

    def _idle_deadline(self, sequence: SequenceRecord) -> float | None:
        """When a live sequence with a slot and nothing queued or running becomes idle."""
        if (sequence.pending or sequence.running or sequence.closed
                or not isinstance(sequence.place, Slot)):
            return None
        return sequence.last_activity + self._idle_s

    def _expire_backlogs(self, now: float) -> list[Rejection]:
        rejections: list[Rejection] = []
        for backlog in [b for b in self._backlogs if b.deadline is not None and b.deadline <= now]:
            self._backlogs.remove(backlog)
            for entry in backlog.entries:
                del self._queued[entry.request.key]
                entry.sequence.pending -= 1
                self._close(entry.sequence)
                rejections.append(backlog_timed_out(entry.request))
        return rejections

    def _reset_free_slots(self) -> None:
        self._free = {(slot.index, slot.instance) for slots in self._instances for slot in slots}

    def slots_of(self, instance: int) -> list[Slot]:
        return self._instances[instance]
