"""Percentiles from the broker's latency histograms (``ModelStats.*_latency``).

The broker's histograms are cumulative since the version was loaded: a recent percentile is
computed from the difference of two readings. Each bucket ``i`` holds durations in
``(bound[i-1], bound[i]]`` (µs, ``bound[-1]`` taken as 0); one extra last bucket holds those
above the last bound. Inside a bucket durations are taken as evenly spread (linear
interpolation, Prometheus' ``histogram_quantile``); a rank that falls in the overflow bucket is
reported as the last bound (a lower bound, the true value is unknown).
"""

from __future__ import annotations

from collections.abc import Sequence

from shoal.messages import LATENCY_BUCKET_BOUNDS_US


def histogram_delta(newer: Sequence[int], older: Sequence[int]) -> list[int]:
    """Counts added between two readings of one histogram. An empty reading is all zeros; a
    count that went down (the version was reloaded between the readings) gives ``newer``."""
    if not older:
        return list(newer)
    if len(newer) != len(older) or any(n < o for n, o in zip(newer, older, strict=True)):
        return list(newer)
    return [n - o for n, o in zip(newer, older, strict=True)]


def percentile_us(counts: Sequence[int], quantile: float,
                  bounds: Sequence[int] = LATENCY_BUCKET_BOUNDS_US) -> float | None:
    """The ``quantile`` (0 < q <= 1) of the durations counted in ``counts`` (non-cumulative
    buckets over ``bounds`` plus the overflow bucket), in µs; None when ``counts`` is empty."""
    if not 0.0 < quantile <= 1.0:
        raise ValueError(f"quantile must be in (0, 1], got {quantile}")
    return bucket_quantile_us(counts, quantile, bounds)


def bucket_quantile_us(counts: Sequence[int], quantile: float,
                       bounds: Sequence[int] = LATENCY_BUCKET_BOUNDS_US) -> float | None:
    """As ``percentile_us`` for any ``quantile`` in [0, 1] (0: the lower bound of the first
    non-empty bucket), unchecked; None when ``counts`` is empty. Shared with the metrics'
    summaries."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = quantile * total
    seen = 0
    for index, count in enumerate(counts):
        if count <= 0:
            continue
        if seen + count >= rank:
            if index >= len(bounds):
                return float(bounds[-1])
            lower = float(bounds[index - 1]) if index > 0 else 0.0
            upper = float(bounds[index])
            return lower + (upper - lower) * max(rank - seen, 0.0) / count
        seen += count
    return float(bounds[-1])
