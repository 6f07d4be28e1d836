"""Direct strategy: slots, rows, backlog, delay and control values of each execution."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.broker.schedulers.sequence import (
    DirectSequenceBatcher,
    SequenceBatch,
    SequenceRequest,
)

from .helpers import END, START, config, numbers, request


def batcher(instances: int = 1, **overrides: object) -> DirectSequenceBatcher:
    return DirectSequenceBatcher(config(**overrides), instances)


def submit_all(scheduler: DirectSequenceBatcher, *requests: SequenceRequest) -> None:
    for r in requests:
        assert scheduler.submit(r, now=r.arrival) is None


def run(scheduler: DirectSequenceBatcher, instance: int = 0, now: float = 0.0) -> SequenceBatch:
    """next_batch, then report it done at the same time."""
    batch = scheduler.next_batch(instance, now)
    assert batch is not None
    scheduler.on_batch_done(batch, now)
    return batch


# ------------------------------------------------------------------ slots and rows


def test_new_sequences_take_the_lowest_free_slot_across_instances() -> None:
    scheduler = batcher(instances=2, max_batch_size=2)
    submit_all(scheduler, *(request(n, 100 + n, START) for n in range(4)))
    first, second = scheduler.next_batch(0, 0.0), scheduler.next_batch(1, 0.0)
    assert numbers(first) == [0, 2] and numbers(second) == [1, 3]
    assert first is not None and [row.slot for row in first.rows] == [0, 1]


def test_a_sequence_keeps_its_slot_and_idle_slots_below_it_are_not_ready() -> None:
    scheduler = batcher(max_batch_size=4)
    submit_all(scheduler, request(0, 10, START), request(1, 11, START), request(2, 12, START))
    assert numbers(run(scheduler)) == [0, 1, 2]
    submit_all(scheduler, request(3, 12))  # sequence 12 is in slot 2
    batch = run(scheduler)
    assert numbers(batch) == [None, None, 3]
    assert batch.filler is not None and batch.filler.key == (b"fe", 3)
    assert [row.control.ready for row in batch.rows] == [False, False, True]


def test_an_execution_stops_at_the_highest_ready_slot() -> None:
    scheduler = batcher(max_batch_size=4)
    submit_all(scheduler, request(0, 10, START), request(1, 11, START))
    run(scheduler)
    submit_all(scheduler, request(2, 10))
    batch = run(scheduler)
    assert numbers(batch) == [2]
    assert batch.filler is None


def test_one_request_per_slot_per_execution_in_arrival_order() -> None:
    scheduler = batcher(max_batch_size=2)
    submit_all(scheduler, request(0, 10, START), request(1, 10), request(2, 10, END))
    assert [numbers(run(scheduler)) for _ in range(3)] == [[0], [1], [2]]
    assert scheduler.next_batch(0, 0.0) is None


def test_the_control_tensors_cover_every_row() -> None:
    scheduler = batcher(max_batch_size=4)
    submit_all(scheduler, request(0, 10, START), request(1, 11, START), request(2, 12, START))
    run(scheduler)
    submit_all(scheduler, request(3, 10, END), request(4, 12))
    batch = run(scheduler)
    tensors = batch.control_tensors(scheduler.config.controls, batching=True)
    assert {name: t[:, 0].tolist() for name, t in tensors.items()} == {
        "START": [0, 0, 0], "END": [1, 0, 0], "READY": [1, 0, 1], "CORRID": [10, 0, 12]}
    assert tensors["CORRID"].dtype == np.uint64


def test_a_model_without_batching_has_one_slot_per_instance() -> None:
    scheduler = batcher(instances=2, max_batch_size=0)
    submit_all(scheduler, request(0, 10, START), request(1, 11, START), request(2, 12, START))
    assert numbers(scheduler.next_batch(0, 0.0)) == [0]
    batch = scheduler.next_batch(1, 0.0)
    assert numbers(batch) == [1]
    assert batch is not None
    assert batch.control_tensors(scheduler.config.controls, batching=False)["READY"].shape == (1,)
    assert scheduler.pending_count() == 1  # sequence 12 waits in the backlog


def test_a_slot_whose_shapes_differ_runs_not_ready_and_waits() -> None:
    scheduler = batcher(max_batch_size=2)
    submit_all(scheduler, request(0, 10, START, signature="a"),
               request(1, 11, START, signature="b"))
    first = run(scheduler)
    assert numbers(first) == [0, None]
    assert first.filler is not None and first.filler.key == (b"fe", 0)
    assert numbers(run(scheduler)) == [None, 1]


# ------------------------------------------------------------------ backlog and slot reuse


def test_a_sequence_waits_in_the_backlog_until_a_slot_ends() -> None:
    scheduler = batcher(max_batch_size=1)
    submit_all(scheduler, request(0, 10, START), request(1, 11, START), request(2, 11))
    assert numbers(run(scheduler)) == [0]
    assert scheduler.next_batch(0, 0.0) is None  # 11 has no slot yet
    submit_all(scheduler, request(3, 10, END))
    assert numbers(run(scheduler)) == [3]  # the END frees the slot; 11 runs from the next one
    assert [numbers(run(scheduler)) for _ in range(2)] == [[1], [2]]


def test_the_backlog_is_served_first_in_first_out() -> None:
    scheduler = batcher(max_batch_size=1)
    submit_all(scheduler, request(0, 10, START | END), request(1, 11, START | END),
               request(2, 12, START | END))
    assert [numbers(run(scheduler)) for _ in range(3)] == [[0], [1], [2]]


def test_a_freed_slot_goes_to_the_backlog_while_other_slots_keep_their_sequences() -> None:
    scheduler = batcher(max_batch_size=2)
    submit_all(scheduler, request(0, 10, START), request(1, 11, START), request(2, 12, START))
    assert numbers(run(scheduler)) == [0, 1]
    submit_all(scheduler, request(3, 10, END), request(4, 11))
    assert numbers(run(scheduler)) == [3, 4]
    submit_all(scheduler, request(5, 11))
    assert numbers(run(scheduler)) == [2, 5]  # 12 took slot 0


def test_a_new_start_after_end_takes_any_free_slot() -> None:
    scheduler = batcher(max_batch_size=2)
    submit_all(scheduler, request(0, 10, START | END), request(1, 10, START))
    assert numbers(run(scheduler)) == [0, 1]


# ------------------------------------------------------------------ delay and utilization


def test_waits_for_the_delay_while_slot_utilization_is_low() -> None:
    scheduler = batcher(max_batch_size=4, max_queue_delay_us=100_000, minimum_slot_utilization=0.5)
    submit_all(scheduler, request(0, 10, START, at=1.0))
    assert scheduler.next_batch(0, 1.05) is None
    assert scheduler.next_deadline(1.05) == pytest.approx(1.1)
    assert numbers(scheduler.next_batch(0, 1.1)) == [0]


def test_enough_ready_slots_start_the_execution_before_the_delay() -> None:
    scheduler = batcher(max_batch_size=4, max_queue_delay_us=100_000, minimum_slot_utilization=0.5)
    submit_all(scheduler, request(0, 10, START), request(1, 11, START))
    assert numbers(scheduler.next_batch(0, 0.0)) == [0, 1]


@pytest.mark.parametrize(("delay_us", "utilization"), [(0, 0.9), (100_000, 0.0)])
def test_zero_delay_or_zero_utilization_starts_at_once(delay_us: int, utilization: float) -> None:
    scheduler = batcher(max_batch_size=4, max_queue_delay_us=delay_us,
                        minimum_slot_utilization=utilization)
    submit_all(scheduler, request(0, 10, START))
    assert numbers(scheduler.next_batch(0, 0.0)) == [0]
    assert scheduler.next_deadline(0.0) is None  # running: no idle clock until it completes


def test_nothing_queued_means_no_batch_and_no_deadline() -> None:
    scheduler = batcher()
    assert scheduler.next_batch(0, 0.0) is None
    assert scheduler.next_deadline(0.0) is None


def test_the_wrong_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="direct-strategy"):
        DirectSequenceBatcher(config(strategy="oldest"), 1)
    with pytest.raises(ValueError, match="at least one instance"):
        DirectSequenceBatcher(config(), 0)


def test_has_batch_follows_next_batch_without_taking_anything() -> None:
    scheduler = batcher(max_batch_size=4, max_queue_delay_us=100_000, minimum_slot_utilization=0.5)
    assert not scheduler.has_batch(0, 1.0)
    submit_all(scheduler, request(0, 10, START, at=1.0))
    assert not scheduler.has_batch(0, 1.05)  # waiting for the delay
    assert scheduler.has_batch(0, 1.1)
    assert scheduler.pending_count() == 1
    assert numbers(scheduler.next_batch(0, 1.1)) == [0]
