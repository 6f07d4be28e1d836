from __future__ import annotations

import pytest

from shoal.broker.schedulers.default import DefaultScheduler

from .helpers import key, numbers, request


def test_runs_one_request_per_batch_in_arrival_order() -> None:
    scheduler = DefaultScheduler()
    for n in range(3):
        assert scheduler.submit(request(n, at=n), now=n) is None
    assert [numbers(scheduler.next_batch(5.0)) for _ in range(3)] == [[0], [1], [2]]
    assert scheduler.next_batch(5.0) is None


def test_ignores_priority_and_request_timeout() -> None:
    scheduler = DefaultScheduler()
    scheduler.submit(request(0, timeout_us=1), now=0.0)
    scheduler.submit(request(1, priority=1), now=0.0)
    assert scheduler.expire(100.0) == []
    assert scheduler.next_deadline(100.0) is None
    assert numbers(scheduler.next_batch(100.0)) == [0]


def test_counts_requests_and_rows() -> None:
    scheduler = DefaultScheduler()
    scheduler.submit(request(0, rows=3), now=0.0)
    scheduler.submit(request(1, rows=0), now=0.0)  # a non-batching request counts as one row
    assert (scheduler.pending_count(), scheduler.pending_rows()) == (2, 4)
    scheduler.next_batch(0.0)
    assert (scheduler.pending_count(), scheduler.pending_rows()) == (1, 1)


def test_cancel_removes_only_that_request() -> None:
    scheduler = DefaultScheduler()
    for n in range(3):
        scheduler.submit(request(n, rows=2), now=0.0)
    cancelled = scheduler.cancel(key(1))
    assert cancelled is not None and cancelled.key == key(1)
    assert scheduler.cancel(key(1)) is None
    assert scheduler.pending_rows() == 4
    assert [numbers(scheduler.next_batch(0.0)) for _ in range(2)] == [[0], [2]]


def test_drain_returns_everything_in_order_and_empties() -> None:
    scheduler = DefaultScheduler()
    for n in range(3):
        scheduler.submit(request(n), now=0.0)
    assert numbers(scheduler.drain()) == [0, 1, 2]
    assert (scheduler.pending_count(), scheduler.pending_rows()) == (0, 0)
    assert scheduler.next_batch(0.0) is None


def test_duplicate_key_is_a_caller_error() -> None:
    scheduler = DefaultScheduler()
    scheduler.submit(request(0), now=0.0)
    with pytest.raises(ValueError):
        scheduler.submit(request(0), now=0.0)


def test_has_batch_says_whether_next_batch_would_give_one() -> None:
    scheduler = DefaultScheduler()
    assert not scheduler.has_batch(0.0)
    scheduler.submit(request(1), 0.0)
    assert scheduler.has_batch(0.0)
    assert scheduler.pending_count() == 1  # nothing taken
