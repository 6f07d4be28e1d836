"""Oldest strategy: candidate sequences per instance, dynamic batching across sequences."""

from __future__ import annotations

import pytest

from shoal.broker.schedulers.sequence import (
    OldestSequenceBatcher,
    SequenceBatch,
    SequenceReleased,
    SequenceRequest,
    StateSpec,
    create_sequence_batcher,
)

from .helpers import END, START, config, key, numbers, request


def batcher(instances: int = 1, **overrides: object) -> OldestSequenceBatcher:
    values: dict[str, object] = {"strategy": "oldest", "max_batch_size": 4}
    values.update(overrides)
    return OldestSequenceBatcher(config(**values), instances)


def submit_all(scheduler: OldestSequenceBatcher, *requests: SequenceRequest) -> None:
    for r in requests:
        assert scheduler.submit(r, now=r.arrival) is None


def run(scheduler: OldestSequenceBatcher, now: float = 0.0, instance: int = 0) -> SequenceBatch:
    batch = scheduler.next_batch(instance, now)
    assert batch is not None
    scheduler.on_batch_done(batch, now)
    return batch


def test_the_factory_picks_the_strategy() -> None:
    assert isinstance(create_sequence_batcher(config(strategy="oldest"), 1), OldestSequenceBatcher)
    with pytest.raises(ValueError, match="oldest-strategy"):
        OldestSequenceBatcher(config(), 1)


def test_requests_of_different_sequences_are_batched_together() -> None:
    scheduler = batcher()
    submit_all(scheduler, request(0, 10, START), request(1, 11, START), request(2, 12, START))
    batch = run(scheduler)
    assert numbers(batch) == [0, 1, 2]
    assert [row.slot for row in batch.rows] == [0, 1, 2]
    assert batch.filler is None and all(row.control.ready for row in batch.rows)


def test_never_two_requests_of_one_sequence_in_one_execution() -> None:
    scheduler = batcher()
    submit_all(scheduler, request(0, 10, START), request(1, 10), request(2, 10, END),
               request(3, 11, START))
    first = scheduler.next_batch(0, 0.0)
    assert numbers(first) == [0, 3]
    assert scheduler.next_batch(0, 0.0) is None  # 10's next waits for its previous one
    assert first is not None
    scheduler.on_batch_done(first, 0.1)
    assert numbers(run(scheduler, 0.1)) == [1]
    assert numbers(run(scheduler, 0.2)) == [2]
    assert scheduler.pending_count() == 0


def test_an_execution_mixes_starts_continuations_and_ends() -> None:
    scheduler = batcher()
    submit_all(scheduler, request(0, 10, START), request(1, 11, START))
    run(scheduler)
    submit_all(scheduler, request(2, 11, END), request(3, 10), request(4, 12, START))
    batch = run(scheduler)
    assert numbers(batch) == [2, 3, 4]
    tensors = batch.control_tensors(scheduler.config.controls, batching=True)
    assert {name: t[:, 0].tolist() for name, t in tensors.items()} == {
        "START": [0, 0, 1], "END": [1, 0, 0], "READY": [1, 1, 1], "CORRID": [11, 10, 12]}


def test_preferred_size_and_queue_delay_decide_when_to_run() -> None:
    scheduler = batcher(preferred_batch_sizes=(2,), max_queue_delay_us=100_000)
    submit_all(scheduler, request(0, 10, START, at=0.0))
    assert scheduler.next_batch(0, 0.0) is None
    assert scheduler.next_deadline(0.0) == pytest.approx(0.1)
    submit_all(scheduler, request(1, 11, START, at=0.05))
    assert numbers(scheduler.next_batch(0, 0.05)) == [0, 1]


def test_the_queue_delay_counts_from_issue_not_from_arrival() -> None:
    scheduler = batcher(preferred_batch_sizes=(2,), max_queue_delay_us=100_000)
    submit_all(scheduler, request(0, 10, START), request(1, 11, START))
    first = scheduler.next_batch(0, 0.0)
    assert first is not None
    submit_all(scheduler, request(2, 10, at=0.5))
    scheduler.on_batch_done(first, 1.0)  # 2 is issued now, at 1.0
    assert scheduler.next_batch(0, 1.05) is None
    assert scheduler.next_deadline(1.05) == pytest.approx(1.1)
    assert numbers(scheduler.next_batch(0, 1.1)) == [2]


def test_max_batch_size_caps_an_execution() -> None:
    scheduler = batcher(max_batch_size=2, max_candidate_sequences=3)
    submit_all(scheduler, *(request(n, 10 + n, START) for n in range(3)))
    assert numbers(run(scheduler)) == [0, 1]
    assert numbers(run(scheduler)) == [2]


def test_different_shapes_do_not_share_an_execution() -> None:
    scheduler = batcher()
    submit_all(scheduler, request(0, 10, START, signature="a"),
               request(1, 11, START, signature="b"))
    assert numbers(run(scheduler)) == [0]
    assert numbers(run(scheduler)) == [1]


def test_candidate_sequences_bound_the_slots_and_the_rest_wait_in_the_backlog() -> None:
    scheduler = batcher(max_candidate_sequences=2)
    submit_all(scheduler, request(0, 10, START), request(1, 11, START), request(2, 12, START))
    assert numbers(run(scheduler)) == [0, 1]
    submit_all(scheduler, request(3, 10, END))
    end_batch = scheduler.next_batch(0, 0.0)
    assert numbers(end_batch) == [3]
    assert scheduler.next_batch(0, 0.0) is None  # 12 got 10's slot but waits for the END
    assert end_batch is not None
    scheduler.on_batch_done(end_batch, 0.1)
    assert numbers(run(scheduler, 0.1)) == [2]


def test_sequences_spread_over_instances() -> None:
    scheduler = batcher(instances=2, max_candidate_sequences=2)
    submit_all(scheduler, *(request(n, 10 + n, START) for n in range(4)))
    assert numbers(scheduler.next_batch(0, 0.0)) == [0, 2]
    assert numbers(scheduler.next_batch(1, 0.0)) == [1, 3]


def test_a_model_without_batching_runs_one_request_at_a_time() -> None:
    scheduler = batcher(max_batch_size=0, max_candidate_sequences=2)
    submit_all(scheduler, request(0, 10, START), request(1, 11, START))
    assert numbers(run(scheduler)) == [0]
    assert numbers(run(scheduler)) == [1]


def test_an_idle_sequence_is_released_after_its_last_completion() -> None:
    scheduler = batcher(max_candidate_sequences=1)
    submit_all(scheduler, request(0, 10, START), request(1, 11, START))
    run(scheduler, 0.2)
    assert scheduler.expire(1.1) == []
    assert scheduler.expire(1.2) == [SequenceReleased(10, 0, "idle")]
    assert numbers(run(scheduler, 1.2)) == [1]


def test_cancelling_an_issued_request_ends_its_sequence() -> None:
    scheduler = batcher(preferred_batch_sizes=(2,), max_queue_delay_us=100_000)
    submit_all(scheduler, request(0, 10, START), request(1, 10))
    assert scheduler.pending_count() == 2
    assert [r.key for r in scheduler.cancel(key(0), now=0.0)] == [key(0), key(1)]
    assert scheduler.pending_count() == 0
    assert scheduler.next_batch(0, 1.0) is None
    assert scheduler.expire(0.0) == [SequenceReleased(10, 0, "cancelled")]
    submit_all(scheduler, request(2, 11, START))  # the slot is free again
    assert numbers(scheduler.next_batch(0, 0.2)) == [2]


def test_state_of_a_sequence_cancelled_while_issued_is_freed_with_that_execution() -> None:
    state = StateSpec("IN", "OUT", "FP32", (1,), (1, 1))
    scheduler = batcher(states=(state,), preferred_batch_sizes=(2,), max_queue_delay_us=100_000)
    submit_all(scheduler, request(0, 10, START), request(1, 11, START))
    first = run(scheduler)
    serial = first.rows[0].state.serial if first.rows[0].state else -1
    submit_all(scheduler, request(2, 10), request(3, 10))  # 2 is issued, 3 queued in the slot
    assert [r.key for r in scheduler.cancel(key(3), now=0.0)] == [key(3)]
    assert scheduler.expire(0.0) == [SequenceReleased(10, 0, "cancelled", None)]
    batch = scheduler.next_batch(0, 0.1)
    assert numbers(batch) == [2] and batch is not None
    assert batch.released_states == (serial,)  # freed after 2 ran, not before


def test_a_failed_instance_returns_its_issued_and_queued_requests() -> None:
    scheduler = batcher(instances=2, preferred_batch_sizes=(4,), max_queue_delay_us=100_000)
    submit_all(scheduler, request(0, 10, START), request(1, 11, START), request(2, 10))
    assert [r.key for r in scheduler.fail_instance(0, now=0.0)] == [key(0), key(2)]
    assert scheduler.pending_count() == 1
    assert scheduler.expire(0.0) == [SequenceReleased(10, 0, "instance_failed")]
    assert numbers(scheduler.next_batch(1, 1.0)) == [1]


def test_drain_returns_issued_then_queued_then_backlogged_requests() -> None:
    scheduler = batcher(max_candidate_sequences=1)
    submit_all(scheduler, request(0, 10, START), request(1, 10), request(2, 11, START))
    assert [r.key for r in scheduler.drain()] == [key(0), key(1), key(2)]
    assert scheduler.pending_count() == 0
    assert scheduler.next_batch(0, 1.0) is None


def test_a_new_sequence_prefers_a_free_slot_that_is_not_busy() -> None:
    scheduler = batcher(max_candidate_sequences=2)
    submit_all(scheduler, request(0, 10, START | END))  # slot 0 is freed as its END is issued
    submit_all(scheduler, request(1, 11, START))
    assert numbers(scheduler.next_batch(0, 0.0)) == [0, 1]  # 11 took slot 1, not busy slot 0


def test_a_busy_freed_slot_is_used_when_no_other_is_free() -> None:
    scheduler = batcher(max_candidate_sequences=1)
    submit_all(scheduler, request(0, 10, START | END), request(1, 11, START))
    first = scheduler.next_batch(0, 0.0)
    assert numbers(first) == [0] and first is not None
    scheduler.on_batch_done(first, 0.1)
    assert numbers(scheduler.next_batch(0, 0.1)) == [1]


def test_has_batch_follows_next_batch_without_taking_anything() -> None:
    scheduler = batcher(max_queue_delay_us=100_000)
    assert not scheduler.has_batch(0, 0.0)
    submit_all(scheduler, request(0, 10, START, at=0.0))
    assert not scheduler.has_batch(0, 0.05)  # waiting for the delay
    assert scheduler.has_batch(0, 0.1)
    assert scheduler.pending_count() == 1
    assert numbers(run(scheduler, now=0.1)) == [0]
