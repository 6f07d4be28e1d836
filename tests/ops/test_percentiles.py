"""Percentiles from the broker's latency histograms: deltas between readings, linear
interpolation inside a bucket, the overflow bucket."""

from __future__ import annotations

import random

import pytest

from shoal.messages import LATENCY_BUCKET_BOUNDS_US
from shoal.ops.percentiles import histogram_delta, percentile_us

BOUNDS = LATENCY_BUCKET_BOUNDS_US


def bucket_of(us: float) -> int:
    for index, bound in enumerate(BOUNDS):
        if us <= bound:
            return index
    return len(BOUNDS)


def histogram(durations_us: list[float]) -> list[int]:
    counts = [0] * (len(BOUNDS) + 1)
    for us in durations_us:
        counts[bucket_of(us)] += 1
    return counts


def test_percentile_interpolates_linearly_inside_the_bucket() -> None:
    counts = [0] * (len(BOUNDS) + 1)
    index = BOUNDS.index(1000)  # bucket (700, 1000] µs
    counts[index] = 10
    assert percentile_us(counts, 0.5) == pytest.approx(700 + 300 * 0.5)
    assert percentile_us(counts, 0.1) == pytest.approx(700 + 300 * 0.1)
    assert percentile_us(counts, 1.0) == pytest.approx(1000)


def test_first_bucket_starts_at_zero() -> None:
    counts = [4] + [0] * len(BOUNDS)
    assert percentile_us(counts, 0.5) == pytest.approx(BOUNDS[0] / 2)


def test_overflow_bucket_reports_the_last_bound() -> None:
    counts = [0] * len(BOUNDS) + [3]
    assert percentile_us(counts, 0.99) == float(BOUNDS[-1])


def test_empty_histogram_has_no_percentile() -> None:
    assert percentile_us([], 0.5) is None
    assert percentile_us([0] * (len(BOUNDS) + 1), 0.99) is None


def test_quantile_outside_range_is_refused() -> None:
    with pytest.raises(ValueError, match="quantile"):
        percentile_us([1], 0.0)


def test_percentiles_of_a_known_sample_fall_in_the_right_bucket() -> None:
    rng = random.Random(7)
    durations = [rng.lognormvariate(7.0, 0.8) for _ in range(20_000)]  # ~1 ms median
    ordered = sorted(durations)
    counts = histogram(durations)
    for quantile in (0.5, 0.9, 0.99):
        exact = ordered[int(quantile * len(ordered)) - 1]
        estimate = percentile_us(counts, quantile)
        assert estimate is not None
        index = bucket_of(exact)
        lower = BOUNDS[index - 1] if index else 0
        assert lower <= estimate <= BOUNDS[index]  # same bucket as the true value
        assert estimate == pytest.approx(exact, rel=0.2)


def test_delta_between_readings_isolates_the_recent_requests() -> None:
    old = histogram([100.0] * 1000)  # a fast past
    new = [a + b for a, b in zip(old, histogram([5000.0] * 10), strict=True)]  # slow now
    recent = histogram_delta(new, old)
    assert sum(recent) == 10
    p50 = percentile_us(recent, 0.5)
    assert p50 is not None and 3000 < p50 <= 5000
    cumulative = percentile_us(new, 0.5)
    assert cumulative is not None and cumulative <= 100  # what a cumulative view would say


def test_delta_from_an_empty_reading_and_after_a_reload() -> None:
    new = histogram([20.0, 30.0])
    assert histogram_delta(new, []) == new
    reloaded = histogram([20.0])  # counters restarted from zero: below the older reading
    assert histogram_delta(reloaded, new) == reloaded
