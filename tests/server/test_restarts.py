"""The supervisor's frontend restart policy (pure, fake clock)."""

from __future__ import annotations

from shoal.server.restarts import BACKOFF_S, MAX_QUICK_DEATHS, QUICK_DEATH_S, RestartTracker


def test_quick_deaths_back_off_then_give_up() -> None:
    tracker = RestartTracker(started_at=0.0)
    now, delays = 0.0, []
    for _ in range(MAX_QUICK_DEATHS - 1):
        now += 1.0
        delay = tracker.died(now)
        assert delay is not None
        delays.append(delay)
        now += delay
        tracker.started(now)
    assert delays == list(BACKOFF_S[:MAX_QUICK_DEATHS - 1])
    assert delays[0] == 0.0  # the first restart is at once
    assert tracker.died(now + 1.0) is None


def test_a_frontend_that_served_a_while_starts_the_count_afresh() -> None:
    tracker = RestartTracker(started_at=0.0)
    for _ in range(MAX_QUICK_DEATHS - 1):
        assert tracker.died(1.0) is not None
        tracker.started(1.0)
    assert tracker.died(1.0 + QUICK_DEATH_S) == 0.0
    assert tracker.quick_deaths == 1
