"""The first-response histogram and the latency summaries, from the broker's histograms."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shoal.frontend.metrics import render_prometheus
from shoal.frontend.metrics.config import MetricsConfig
from shoal.frontend.metrics.latency import SummaryWindows, cumulative_counts, quantile_us
from shoal.messages import (
    LATENCY_BUCKET_BOUNDS_US,
    Duration,
    LatencyHistogram,
    ModelStats,
    RepositorySnapshot,
)
from tests.frontend.http.fakes import make_model

BOUNDS = LATENCY_BUCKET_BOUNDS_US


def histogram(**per_bound_us: int) -> LatencyHistogram:
    """Counts placed in the bucket whose upper bound is ``b<bound in µs>``; ``over`` for the
    overflow bucket."""
    counts = [0] * (len(BOUNDS) + 1)
    for key, count in per_bound_us.items():
        counts[len(BOUNDS) if key == "over" else BOUNDS.index(int(key[1:]))] += count
    return LatencyHistogram(counts)


def stats(name: str = "m", version: int = 1, **overrides: object) -> ModelStats:
    zero = Duration(0, 0)
    values: dict[str, object] = dict(
        name=name, version=version, last_inference_ms=0, inference_count=0, execution_count=0,
        success=zero, fail=zero, queue=zero, compute_input=zero, compute_infer=zero,
        compute_output=zero, batch_stats=[])
    values.update(overrides)
    return ModelStats(**values)  # type: ignore[arg-type]


def families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    return {f.name: [(s.name, s.labels, s.value) for s in f.samples]
            for f in text_string_to_metric_families(text)}


def test_coarse_buckets_sum_exactly_from_the_fine_ones() -> None:
    counts = histogram(b50000=1, b300000=2, b10000000=1, over=1).counts
    assert cumulative_counts(counts, [100_000, 500_000, 2_000_000, 5_000_000]) == [1, 3, 3, 3]


def test_first_response_histogram_is_cumulative_with_inf_for_decoupled_models() -> None:
    first = histogram(b50000=1, b300000=2, b10000000=1)
    decoupled = stats("stream", first_response_latency=first,
                      first_response=Duration(4, 10_650_000_000))
    plain = stats("plain", first_response_latency=first, first_response=Duration(4, 1))
    snapshot = RepositorySnapshot([make_model("stream", decoupled=True), make_model("plain")],
                                  True)
    text = render_prometheus([decoupled, plain], snapshot,
                             config=MetricsConfig(histogram_latencies=True))
    found = families(text)["nv_inference_first_response_histogram_ms"]
    buckets = {s[1]["le"]: s[2] for s in found if s[0].endswith("_bucket")}
    assert buckets == {"100": 1, "500": 3, "2000": 3, "5000": 3, "+Inf": 4}
    assert all(s[1]["model"] == "stream" for s in found)  # decoupled models only, as Triton
    totals = {s[0]: s[2] for s in found if not s[0].endswith("_bucket")}
    assert totals == {"nv_inference_first_response_histogram_ms_count": 4,
                      "nv_inference_first_response_histogram_ms_sum": 10650.0}
    assert "# TYPE nv_inference_first_response_histogram_ms histogram" in text
    assert "nv_inference_first_response_histogram_ms" not in render_prometheus(
        [decoupled], snapshot)  # off unless histogram_latencies=true


def test_quantiles_interpolate_inside_the_bucket() -> None:
    counts = histogram(b3000=10).counts  # ten durations in (2 ms, 3 ms]
    assert quantile_us(counts, 0.5) == pytest.approx(2500)
    assert quantile_us(counts, 1.0) == pytest.approx(3000)
    assert quantile_us(histogram(over=2).counts, 0.5) == BOUNDS[-1]
    assert math.isnan(quantile_us([0] * (len(BOUNDS) + 1), 0.5))
    assert math.isnan(quantile_us([], 0.5))


def test_summary_quantiles_cover_the_window_and_count_and_sum_are_exact() -> None:
    windows = SummaryWindows(max_age_s=60.0)
    before = stats(request_latency=histogram(b100000=50))  # 50 slow requests, long ago
    windows.record(100.0, [before])
    now = stats(request_latency=histogram(b100000=50, b3000=10),
                success=Duration(60, 5_025_000_000))
    config = MetricsConfig(summary_latencies=True, summary_quantiles=((0.5, 0.05), (0.9, 0.01)))
    text = render_prometheus([now], config=config, windows=windows, now=150.0)
    request = {(s[0], s[1].get("quantile")): s[2]
               for s in families(text)["nv_inference_request_summary_us"]}
    assert request[("nv_inference_request_summary_us", "0.5")] == pytest.approx(2500)
    assert request[("nv_inference_request_summary_us", "0.9")] == pytest.approx(2900)
    assert request[("nv_inference_request_summary_us_count", None)] == 60
    assert request[("nv_inference_request_summary_us_sum", None)] == 5_025_000
    queue = families(text)["nv_inference_queue_summary_us"]
    assert all(math.isnan(s[2]) for s in queue if "quantile" in s[1])  # nothing queued
    assert "# TYPE nv_inference_compute_infer_summary_us summary" in text


def test_an_old_reading_leaves_the_window_and_a_reload_restarts_it() -> None:
    windows = SummaryWindows(max_age_s=60.0)
    windows.record(0.0, [stats(queue_latency=histogram(b10=5))])
    assert windows.window(61.0, stats(queue_latency=histogram(b10=5))) is None  # expired
    windows.record(100.0, [stats(queue_latency=histogram(b10=5))])
    reloaded = stats(queue_latency=histogram(b20=2))  # counts went down: a new version
    window = windows.window(110.0, reloaded)
    assert window is not None and sum(window[1]) == 2
    newcomer = stats("new", queue_latency=histogram(b20=3))  # not in the reading: all new
    window = windows.window(110.0, newcomer)
    assert window is not None and sum(window[1]) == 3


def test_summaries_without_a_reading_yet_are_nan() -> None:
    text = render_prometheus([stats(request_latency=histogram(b3000=1),
                                    success=Duration(1, 2_500_000))],
                             config=MetricsConfig(summary_latencies=True))
    request = families(text)["nv_inference_request_summary_us"]
    quantiles = [s for s in request if "quantile" in s[1]]
    assert [s[1]["quantile"] for s in quantiles] == ["0.5", "0.9", "0.95", "0.99", "0.999"]
    assert all(math.isnan(s[2]) for s in quantiles)
    assert ("nv_inference_request_summary_us_count", {"model": "m", "version": "1"}, 1.0) in request
