"""Latency histograms of ModelVersionStats: bucket edges, per-request compute, snapshot."""

from __future__ import annotations

from shoal.broker.stats import ModelVersionStats
from shoal.messages import LATENCY_BUCKET_BOUNDS_US, BatchTimings


def _bucket(hist: list[int]) -> list[int]:
    return [i for i, count in enumerate(hist) for _ in range(count)]


def test_durations_land_in_the_bucket_whose_upper_bound_covers_them() -> None:
    stats = ModelVersionStats("m", 1)
    stats.record_success(10**6, 10_000, 1)  # exactly 10 µs: the first bound is inclusive
    stats.record_success(10**6, 10_001, 1)  # just above: the next bucket
    stats.record_success(10**6, 200 * 10**9, 1)  # 200 s: past the last bound
    counts = stats.snapshot(0).queue_latency.counts
    assert len(counts) == len(LATENCY_BUCKET_BOUNDS_US) + 1
    assert _bucket(counts) == [0, 1, len(LATENCY_BUCKET_BOUNDS_US)]


def test_compute_counts_each_request_of_a_batch_and_success_counts_requests() -> None:
    stats = ModelVersionStats("m", 1)
    timings = BatchTimings(1_000, 2_000_000, 1_000)
    stats.record_execution(rows=4, timings=timings)
    stats.record_compute(timings, requests=3)
    stats.record_success(5 * 10**6, 1_000, rows=2)
    snap = stats.snapshot(pending=2, in_flight=1, instance_restarts={"m_0": 2})
    compute = snap.compute_latency.counts
    index = LATENCY_BUCKET_BOUNDS_US.index(3000)  # 2.002 ms is in (2 ms, 3 ms]
    assert compute[index] == 3 and sum(compute) == 3
    assert sum(snap.request_latency.counts) == 1 and sum(snap.queue_latency.counts) == 1
    assert snap.first_response_latency.counts == []
    assert (snap.execution_count, snap.inference_count) == (1, 2)
    assert [(b.batch_size, b.compute_infer.count) for b in snap.batch_stats] == [(4, 1)]
    assert (snap.pending, snap.in_flight, snap.instance_restarts) == (2, 1, {"m_0": 2})


def test_a_failed_request_counts_in_fail_only_and_its_execution_still_counts() -> None:
    """Triton 2.51, a python model whose execute raised: fail and execution_count / batch_stats
    move; success, queue, compute and inference_count do not."""
    stats = ModelVersionStats("m", 1)
    stats.record_execution(rows=1, timings=BatchTimings(1_000, 2_000, 3_000))
    stats.record_failure(10_000, "BACKEND")
    snap = stats.snapshot(0)
    assert (snap.fail.count, snap.fail_by_reason) == (1, {"BACKEND": 1})
    assert (snap.execution_count, snap.inference_count) == (1, 0)
    assert [(b.batch_size, b.compute_infer.count) for b in snap.batch_stats] == [(1, 1)]
    assert (snap.success.count, snap.queue.count, snap.compute_infer.count) == (0, 0, 0)


def test_bounds_include_every_one_two_five_step_and_are_increasing() -> None:
    bounds = LATENCY_BUCKET_BOUNDS_US
    assert list(bounds) == sorted(set(bounds))
    for decade in range(1, 8):
        for step in (1, 2, 5):
            assert step * 10**decade in bounds


def test_compute_parts_and_first_responses_have_their_own_histograms() -> None:
    stats = ModelVersionStats("m", 1)
    stats.record_compute(BatchTimings(10_000, 3_000_000, 20_000), requests=2)
    stats.record_first_response(150 * 10**6)
    snap = stats.snapshot(0)
    assert _bucket(snap.compute_input_latency.counts) == [0, 0]  # 10 µs
    assert _bucket(snap.compute_infer_latency.counts) == [LATENCY_BUCKET_BOUNDS_US.index(3000)] * 2
    assert _bucket(snap.compute_output_latency.counts) == [LATENCY_BUCKET_BOUNDS_US.index(20)] * 2
    assert (snap.first_response.count, snap.first_response.ns) == (1, 150 * 10**6)
    assert sum(snap.first_response_latency.counts) == 1


def test_a_batch_of_durations_counts_as_each_one_of_them() -> None:
    one_by_one, at_once = ModelVersionStats("m", 1), ModelVersionStats("m", 1)
    durations = [10_000, 10_001, 3 * 10**6, 200 * 10**9]
    for ns in durations:
        one_by_one.record_success(ns, ns // 2, 2)
    at_once.record_successes(durations, [ns // 2 for ns in durations], 2 * len(durations))
    at_once.record_successes([], [], 0)
    one_by_one.last_inference_ms = at_once.last_inference_ms = 0
    assert at_once.snapshot(0) == one_by_one.snapshot(0)
