from __future__ import annotations

import pytest

from shoal.broker.schedulers.base import QUEUE_FULL_MESSAGE, TIMEOUT_MESSAGE, QueuedRequest
from shoal.broker.schedulers.dynamic import DynamicBatcher, DynamicBatcherConfig, QueuePolicy
from shoal.errors import ErrorCode

from .helpers import key, numbers, request

DELAY_US = 100_000  # 0.1 s
DELAY_S = 0.1


def batcher(
    max_batch_size: int = 8,
    preferred: tuple[int, ...] = (),
    delay_us: int = DELAY_US,
    *,
    priority_levels: int = 0,
    default_priority_level: int = 0,
    default_policy: QueuePolicy | None = None,
    priority_policies: dict[int, QueuePolicy] | None = None,
) -> DynamicBatcher:
    config = DynamicBatcherConfig(
        max_batch_size=max_batch_size,
        preferred_batch_sizes=preferred,
        max_queue_delay_us=delay_us,
        priority_levels=priority_levels,
        default_priority_level=default_priority_level,
        default_policy=default_policy or QueuePolicy(),
        priority_policies=priority_policies or {},
    )
    return DynamicBatcher(config)


def submit_all(scheduler: DynamicBatcher, *requests: QueuedRequest) -> None:
    for r in requests:
        assert scheduler.submit(r, now=r.arrival) is None


# ------------------------------------------------------------------ preferred sizes and delay


def test_sends_at_once_when_rows_reach_the_largest_preferred_size() -> None:
    scheduler = batcher(preferred=(4, 8))
    submit_all(scheduler, *(request(n) for n in range(9)))
    assert numbers(scheduler.next_batch(0.0)) == list(range(8))
    assert scheduler.pending_count() == 1


def test_sends_the_largest_preferred_prefix_at_once_before_the_delay() -> None:
    # Triton's GetDynamicBatch: a preferred size that can be formed is sent immediately.
    scheduler = batcher(preferred=(4, 8))
    submit_all(scheduler, *(request(n, at=0.01 * n) for n in range(5)))
    assert numbers(scheduler.next_batch(0.05)) == [0, 1, 2, 3]
    assert scheduler.next_batch(0.05) is None
    assert scheduler.next_deadline(0.05) == pytest.approx(0.04 + DELAY_S)


def test_sends_the_largest_preferred_prefix_not_a_smaller_one() -> None:
    scheduler = batcher(max_batch_size=16, preferred=(2, 4, 8))
    submit_all(scheduler, *(request(n) for n in range(7)))
    assert numbers(scheduler.next_batch(0.0)) == [0, 1, 2, 3]


def test_waits_while_no_preferred_size_is_reached() -> None:
    scheduler = batcher(preferred=(4, 8))
    submit_all(scheduler, request(0, at=0.2), request(1, at=0.25), request(2, at=0.3))
    assert scheduler.next_batch(0.3) is None
    assert scheduler.next_deadline(0.3) == pytest.approx(0.2 + DELAY_S)
    assert scheduler.pending_count() == 3


def test_when_the_delay_has_passed_sends_everything_that_fits() -> None:
    # Triton sends the whole pending batch once the oldest request has waited the delay,
    # even when a preferred size (4 here) is available.
    scheduler = batcher(max_batch_size=8, preferred=(4, 8))
    submit_all(scheduler, *(request(n, at=0.0) for n in range(5)))
    assert numbers(scheduler.next_batch(DELAY_S)) == [0, 1, 2, 3, 4]


def test_delay_counts_from_the_oldest_request_in_the_batch() -> None:
    scheduler = batcher(preferred=(4,))
    submit_all(scheduler, request(0, at=1.0), request(1, at=1.05))
    assert scheduler.next_batch(1.0 + DELAY_S - 1e-6) is None
    deadline = scheduler.next_deadline(1.06)
    assert deadline is not None
    assert numbers(scheduler.next_batch(deadline)) == [0, 1]  # due at exactly the deadline


def test_without_preferred_sizes_waits_for_max_batch_size() -> None:
    scheduler = batcher(max_batch_size=4)
    submit_all(scheduler, *(request(n) for n in range(3)))
    assert scheduler.next_batch(0.0) is None
    scheduler.submit(request(3), now=0.0)
    assert numbers(scheduler.next_batch(0.0)) == [0, 1, 2, 3]


def test_zero_delay_sends_whatever_is_pending_at_once() -> None:
    scheduler = batcher(max_batch_size=8, delay_us=0)
    submit_all(scheduler, request(0), request(1))
    assert numbers(scheduler.next_batch(0.0)) == [0, 1]
    assert scheduler.next_deadline(0.0) is None


def test_zero_delay_still_prefers_a_preferred_size() -> None:
    scheduler = batcher(max_batch_size=8, preferred=(4,), delay_us=0)
    submit_all(scheduler, *(request(n) for n in range(6)))
    assert numbers(scheduler.next_batch(0.0)) == [0, 1, 2, 3]
    assert numbers(scheduler.next_batch(0.0)) == [4, 5]


def test_prefix_is_sent_when_the_next_request_would_pass_the_largest_preferred_size() -> None:
    # Rows 3 + 3 would pass the largest preferred size (4) before any preferred size was met:
    # Triton marks the prefix before it as the batch to send now.
    scheduler = batcher(max_batch_size=8, preferred=(4,))
    submit_all(scheduler, request(0, rows=3), request(1, rows=3))
    assert numbers(scheduler.next_batch(0.0)) == [0]
    assert scheduler.next_batch(0.0) is None


# ------------------------------------------------------------------ rows and shapes


def test_multi_row_requests_batch_together_up_to_max_batch_size() -> None:
    scheduler = batcher(max_batch_size=16)
    submit_all(scheduler, request(0, rows=4), request(1, rows=4), request(2, rows=8))
    assert scheduler.pending_rows() == 16
    batch = scheduler.next_batch(0.0)
    assert numbers(batch) == [0, 1, 2]
    assert sum(r.batch_size for r in batch or []) == 16
    assert scheduler.pending_rows() == 0


def test_request_that_does_not_fit_ends_the_batch_and_is_not_skipped() -> None:
    scheduler = batcher(max_batch_size=16)
    submit_all(scheduler, request(0, rows=8), request(1, rows=4), request(2, rows=8))
    submit_all(scheduler, request(3, rows=1))  # would fit, but must not jump ahead of 2
    assert numbers(scheduler.next_batch(0.0)) == [0, 1]
    assert scheduler.next_batch(0.0) is None  # 8 + 1 rows: waits for the delay
    assert numbers(scheduler.next_batch(DELAY_S)) == [2, 3]


def test_different_shape_signature_ends_the_batch() -> None:
    scheduler = batcher(max_batch_size=8)
    submit_all(
        scheduler,
        request(0, signature=(3,)),
        request(1, signature=(5,)),
        request(2, signature=(3,)),
    )
    assert numbers(scheduler.next_batch(0.0)) == [0]  # no skipping ahead to request 2
    assert numbers(scheduler.next_batch(0.0)) == [1]
    assert scheduler.next_batch(0.0) is None
    assert numbers(scheduler.next_batch(DELAY_S)) == [2]


def test_model_without_batching_runs_one_request_per_batch() -> None:
    scheduler = batcher(max_batch_size=0)
    submit_all(scheduler, request(0), request(1))
    assert numbers(scheduler.next_batch(0.0)) == [0]
    assert numbers(scheduler.next_batch(0.0)) == [1]


# ------------------------------------------------------------------ priorities


def prioritized(priority_policies: dict[int, QueuePolicy] | None = None) -> DynamicBatcher:
    return batcher(
        max_batch_size=2,
        preferred=(2,),
        priority_levels=2,
        default_priority_level=2,
        priority_policies=priority_policies,
    )


def test_higher_priority_request_jumps_ahead() -> None:
    scheduler = prioritized()
    submit_all(scheduler, request(0, priority=2, at=0.0), request(1, priority=0, at=0.01))
    submit_all(scheduler, request(2, priority=1, at=0.02))
    assert numbers(scheduler.next_batch(0.02)) == [2, 0]
    assert scheduler.next_batch(0.02) is None  # request 1 waits for a partner or the delay


def test_out_of_range_priority_uses_the_default_level() -> None:
    scheduler = prioritized()
    submit_all(scheduler, request(0, priority=7), request(1, priority=1))
    assert numbers(scheduler.next_batch(0.0)) == [1, 0]


def test_delay_counts_from_the_oldest_request_of_any_level() -> None:
    scheduler = batcher(max_batch_size=4, priority_levels=2, default_priority_level=2)
    submit_all(scheduler, request(0, priority=2, at=0.0), request(1, priority=1, at=0.05))
    assert scheduler.next_deadline(0.05) == pytest.approx(DELAY_S)
    assert numbers(scheduler.next_batch(DELAY_S)) == [1, 0]


# ------------------------------------------------------------------ queue policy


def test_full_queue_rejects_immediately() -> None:
    scheduler = batcher(default_policy=QueuePolicy(max_queue_size=2))
    submit_all(scheduler, request(0), request(1))
    rejection = scheduler.submit(request(2), now=0.0)
    assert rejection is not None
    assert (rejection.request.key, rejection.code, rejection.message) == (
        key(2),
        ErrorCode.UNAVAILABLE,
        QUEUE_FULL_MESSAGE,
    )
    assert scheduler.pending_count() == 2


def test_max_queue_size_is_per_priority_level() -> None:
    scheduler = prioritized(priority_policies={1: QueuePolicy(max_queue_size=1)})
    submit_all(scheduler, request(0, priority=1), request(1, priority=2), request(2, priority=2))
    assert scheduler.submit(request(3, priority=1), now=0.0) is not None


def test_reject_timeout_is_returned_by_expire() -> None:
    scheduler = batcher(delay_us=1_000_000, default_policy=QueuePolicy(default_timeout_us=50_000))
    submit_all(scheduler, request(0, at=0.0), request(1, at=0.03))
    assert scheduler.next_deadline(0.0) == pytest.approx(0.05)
    assert scheduler.expire(0.049) == []
    rejected = scheduler.expire(0.05)
    assert [(r.request.key, r.code, r.message) for r in rejected] == [
        (key(0), ErrorCode.UNAVAILABLE, TIMEOUT_MESSAGE)
    ]
    assert scheduler.pending_count() == 1
    assert scheduler.next_deadline(0.05) == pytest.approx(0.08)


@pytest.mark.parametrize(
    ("allow_override", "request_timeout_us", "expected_deadline"),
    [(True, 10_000, 0.01), (True, 90_000, 0.05), (False, 10_000, 0.05)],
)
def test_request_timeout_applies_only_when_override_is_allowed_and_shorter(
    allow_override: bool, request_timeout_us: int, expected_deadline: float
) -> None:
    policy = QueuePolicy(default_timeout_us=50_000, allow_timeout_override=allow_override)
    scheduler = batcher(delay_us=1_000_000, default_policy=policy)
    submit_all(scheduler, request(0, timeout_us=request_timeout_us))
    assert scheduler.next_deadline(0.0) == pytest.approx(expected_deadline)
    assert scheduler.expire(expected_deadline - 1e-6) == []
    assert len(scheduler.expire(expected_deadline)) == 1


def test_request_timeout_is_ignored_without_a_default_timeout() -> None:
    policy = QueuePolicy(default_timeout_us=0, allow_timeout_override=True)
    scheduler = batcher(delay_us=1_000_000, default_policy=policy)
    submit_all(scheduler, request(0, timeout_us=10))
    assert scheduler.expire(100.0) == []
    assert scheduler.next_deadline(0.0) == pytest.approx(1.0)  # only the queue delay


def test_delay_timeout_moves_request_behind_unexpired_ones() -> None:
    policy = QueuePolicy(timeout_action="DELAY", default_timeout_us=10_000)
    scheduler = batcher(max_batch_size=1, delay_us=0, default_policy=policy)
    submit_all(scheduler, request(0, at=0.0), request(1, at=0.008))
    assert scheduler.expire(0.012) == []  # request 0 is delayed, not rejected
    assert scheduler.pending_count() == 2
    assert scheduler.next_deadline(0.012) == pytest.approx(0.018)
    assert numbers(scheduler.next_batch(0.012)) == [1]
    assert numbers(scheduler.next_batch(0.012)) == [0]


def test_next_batch_applies_timeouts_and_keeps_rejections_for_expire() -> None:
    scheduler = batcher(delay_us=0, default_policy=QueuePolicy(default_timeout_us=10_000))
    submit_all(scheduler, request(0, at=0.0), request(1, at=0.005))
    assert numbers(scheduler.next_batch(0.012)) == [1]  # expired request 0 is not sent
    assert scheduler.next_deadline(0.012) == 0.012  # a rejection is waiting to be collected
    assert [r.request.key for r in scheduler.expire(0.012)] == [key(0)]
    assert scheduler.expire(0.012) == []
    assert scheduler.next_deadline(0.012) is None


def test_expired_request_is_never_sent_even_without_expire() -> None:
    scheduler = batcher(delay_us=0, default_policy=QueuePolicy(default_timeout_us=10_000))
    submit_all(scheduler, request(0, at=0.0))
    assert scheduler.next_batch(0.02) is None
    assert scheduler.pending_count() == 0


# ------------------------------------------------------------------ next_deadline


def test_next_deadline_is_none_when_empty() -> None:
    assert batcher().next_deadline(0.0) is None


def test_next_deadline_ignores_a_batch_that_is_ready_now() -> None:
    scheduler = batcher(max_batch_size=2)
    submit_all(scheduler, request(0), request(1))
    assert scheduler.next_deadline(0.0) is None  # ready now: not a time-driven event


def test_next_deadline_is_the_earlier_of_queue_delay_and_timeout() -> None:
    policy = QueuePolicy(default_timeout_us=50_000)
    scheduler = batcher(delay_us=20_000, default_policy=policy)
    submit_all(scheduler, request(0, at=0.0))
    assert scheduler.next_deadline(0.0) == pytest.approx(0.02)
    scheduler = batcher(delay_us=80_000, default_policy=policy)
    submit_all(scheduler, request(0, at=0.0))
    assert scheduler.next_deadline(0.0) == pytest.approx(0.05)


def test_next_deadline_reports_a_timeout_that_has_not_been_collected() -> None:
    scheduler = batcher(delay_us=1_000_000, default_policy=QueuePolicy(default_timeout_us=10_000))
    submit_all(scheduler, request(0, at=0.0))
    deadline = scheduler.next_deadline(0.5)
    assert deadline is not None and deadline <= 0.5


# ------------------------------------------------------------------ cancel and drain


def test_cancel_removes_the_request_and_its_deadline() -> None:
    policy = QueuePolicy(default_timeout_us=10_000)
    scheduler = batcher(max_batch_size=4, delay_us=1_000_000, default_policy=policy)
    submit_all(scheduler, request(0, at=0.0, rows=2), request(1, at=0.5), request(2, at=0.5))
    cancelled = scheduler.cancel(key(0))
    assert cancelled is not None and cancelled.key == key(0)
    assert scheduler.cancel(key(0)) is None
    assert (scheduler.pending_count(), scheduler.pending_rows()) == (2, 2)
    assert scheduler.next_deadline(0.5) == pytest.approx(0.51)
    assert scheduler.next_batch(1.5) is None  # both timed out meanwhile
    assert len(scheduler.expire(1.5)) == 2


def test_drain_returns_everything_in_dispatch_order() -> None:
    scheduler = prioritized()
    submit_all(scheduler, request(0, priority=2), request(1, priority=1), request(2, priority=2))
    assert numbers(scheduler.drain()) == [1, 0, 2]
    assert (scheduler.pending_count(), scheduler.pending_rows()) == (0, 0)
    assert scheduler.next_batch(10.0) is None
    assert scheduler.next_deadline(10.0) is None


def test_duplicate_key_is_a_caller_error() -> None:
    scheduler = batcher()
    submit_all(scheduler, request(0))
    with pytest.raises(ValueError):
        scheduler.submit(request(0), now=0.0)


def test_ready_batch_reports_no_deadline_so_callers_dispatch_first() -> None:
    """The contract the broker loop relies on (it dispatches before computing its sleep): once the
    delay has passed, next_deadline is None while next_batch hands the batch out."""
    from shoal.broker.schedulers.base import QueuedRequest
    from shoal.broker.schedulers.dynamic import DynamicBatcher, DynamicBatcherConfig

    batcher = DynamicBatcher(DynamicBatcherConfig(max_batch_size=32, max_queue_delay_us=100))
    batcher.submit(QueuedRequest((b"f", 1), 1, 10.0), 10.0)
    assert batcher.next_deadline(10.00005) == 10.0001
    assert batcher.next_deadline(10.0002) is None
    assert batcher.next_batch(10.0002) is not None


def test_has_batch_follows_the_delay_without_taking_anything() -> None:
    scheduler = batcher(preferred=(4,))
    submit_all(scheduler, request(1, at=0.0))
    assert not scheduler.has_batch(0.05)  # waiting for partners
    assert scheduler.has_batch(DELAY_S)
    assert scheduler.pending_count() == 1
    assert numbers(scheduler.next_batch(DELAY_S)) == [1]
