"""Triton's latency histogram and summaries, from the broker's latency histograms.

The broker counts each duration in a bucket of ``LATENCY_BUCKET_BOUNDS_US`` (1, 1.5, 2, 3, 5, 7
per decade, 10 µs to 100 s; every 1-2-5 step among them). Both families are computed from those
counts on each scrape:

- ``nv_inference_first_response_histogram_ms`` (``histogram_latencies``; decoupled models, as
  Triton): Triton's default buckets 100, 500, 2000, 5000 ms are bounds of the broker's buckets,
  so each cumulative count is exact; ``_sum`` is the exact sum in ms.
- ``nv_inference_*_summary_us`` (``summary_latencies``): ``_count`` and ``_sum`` are exact and
  cumulative since the version loaded; the quantiles cover a sliding window of the last 60 s
  (prometheus-cpp's default max age, which Triton keeps), from the difference between the
  counts now and the oldest reading kept inside the window (``SummaryWindows``, fed every
  ``--metrics-interval-ms``), so the window spans 60 s less up to one interval. Within a bucket
  durations are taken as evenly spread (linear interpolation, as Prometheus'
  ``histogram_quantile``): a quantile is exact to within its bucket (at most 50 % wide, e.g.
  2-3 ms); one above 100 s reads 100 s. An empty window gives NaN, as Triton.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Final

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from shoal.frontend.metrics.exposition import number
from shoal.messages import LATENCY_BUCKET_BOUNDS_US, Duration, LatencyHistogram, ModelStats
from shoal.ops.percentiles import bucket_quantile_us, histogram_delta

FIRST_RESPONSE_BUCKETS_MS: Final = (100, 500, 2000, 5000)  # Triton's default buckets

# (name, help, histogram, exact count and sum) per summary, Triton's names and help texts
_Summary = tuple[str, str, Callable[[ModelStats], LatencyHistogram],
                 Callable[[ModelStats], Duration]]
SUMMARIES: Final[tuple[_Summary, ...]] = (
    ("nv_inference_request_summary_us",
     "Summary of inference request duration in microseconds (includes cached requests)",
     lambda s: s.request_latency, lambda s: s.success),
    ("nv_inference_queue_summary_us",
     "Summary of inference queuing duration in microseconds (includes cached requests)",
     lambda s: s.queue_latency, lambda s: s.queue),
    ("nv_inference_compute_input_summary_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     lambda s: s.compute_input_latency, lambda s: s.compute_input),
    ("nv_inference_compute_infer_summary_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)",
     lambda s: s.compute_infer_latency, lambda s: s.compute_infer),
    ("nv_inference_compute_output_summary_us",
     "Cumulative inference compute output duration in microseconds (does not include cached "
     "requests)", lambda s: s.compute_output_latency, lambda s: s.compute_output),
)

_VersionKey = tuple[str, int]
_Reading = dict[_VersionKey, tuple[list[int], ...]]  # per version: counts per summary


def cumulative_counts(counts: Sequence[int], upper_bounds_us: Sequence[int],
                      bounds_us: Sequence[int] = LATENCY_BUCKET_BOUNDS_US) -> list[int]:
    """Cumulative counts at each of ``upper_bounds_us`` (each one of ``bounds_us``) of the
    per-bucket ``counts`` (empty: none counted)."""
    out: list[int] = []
    for upper in upper_bounds_us:
        last = bounds_us.index(upper)
        out.append(sum(counts[:last + 1]))
    return out


def quantile_us(counts: Sequence[int], quantile: float,
                bounds_us: Sequence[int] = LATENCY_BUCKET_BOUNDS_US) -> float:
    """The ``quantile`` (0..1) of the durations in per-bucket ``counts`` (linear inside the
    bucket that holds its rank; the overflow bucket reads as the last bound); NaN if none."""
    value = bucket_quantile_us(counts, quantile, bounds_us)
    return math.nan if value is None else value


class SummaryWindows:
    """Readings of the summary histograms over the last ``max_age_s`` seconds (one per
    ``record``); the window of a scrape starts at the oldest reading kept. Thread-safe: the
    poller records on the event loop while a scrape renders in a thread."""

    def __init__(self, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        self._readings: deque[tuple[float, _Reading]] = deque()
        self._lock = threading.Lock()

    def record(self, now: float, stats: Sequence[ModelStats]) -> None:
        reading = {(s.name, s.version): tuple(list(histogram(s).counts)
                                              for _, _, histogram, _ in SUMMARIES)
                   for s in stats}
        with self._lock:
            self._readings.append((now, reading))
            self._expire(now)

    def _expire(self, now: float) -> None:
        while self._readings and self._readings[0][0] < now - self.max_age_s:
            self._readings.popleft()

    def window(self, now: float, stats: ModelStats) -> list[list[int]] | None:
        """Per summary, the counts added inside the window; None without a reading in it."""
        with self._lock:
            self._expire(now)
            if not self._readings:
                return None
            baseline = self._readings[0][1].get((stats.name, stats.version))
        return [histogram_delta(histogram(stats).counts,
                                baseline[i] if baseline is not None else [])
                for i, (_, _, histogram, _) in enumerate(SUMMARIES)]


def first_response_family(stats: Sequence[ModelStats],
                          decoupled: set[_VersionKey]) -> Iterator[Metric]:
    family = HistogramMetricFamily("nv_inference_first_response_histogram_ms",
                                   "Duration from request to first response in milliseconds",
                                   labels=("model", "version"))
    uppers_us = [ms * 1000 for ms in FIRST_RESPONSE_BUCKETS_MS]
    for s in sorted(stats, key=lambda s: (s.name, s.version)):
        if (s.name, s.version) not in decoupled:
            continue
        counts = s.first_response_latency.counts
        cumulative = cumulative_counts(counts, uppers_us) if counts else [0] * len(uppers_us)
        buckets = [(number(ms), float(c)) for ms, c in zip(FIRST_RESPONSE_BUCKETS_MS,
                                                           cumulative, strict=True)]
        buckets.append(("+Inf", float(sum(counts))))
        family.add_metric((s.name, str(s.version)), buckets, s.first_response.ns / 1e6)
    yield family


def summary_families(stats: Sequence[ModelStats], quantiles: Sequence[tuple[float, float]],
                     windows: SummaryWindows | None, now: float) -> Iterator[Metric]:
    ordered = sorted(stats, key=lambda s: (s.name, s.version))
    added = {(s.name, s.version): windows.window(now, s) if windows is not None else None
             for s in ordered}
    for index, (name, text, _, exact) in enumerate(SUMMARIES):
        family = Metric(name, text, "summary")
        for s in ordered:
            labels = {"model": s.name, "version": str(s.version)}
            window = added[(s.name, s.version)]
            for quantile, _error in quantiles:
                value = quantile_us(window[index], quantile) if window is not None else math.nan
                family.add_sample(name, {**labels, "quantile": number(quantile)}, value)
            duration = exact(s)
            family.add_sample(f"{name}_count", labels, duration.count)
            family.add_sample(f"{name}_sum", labels, duration.ns / 1000.0)
        yield family
