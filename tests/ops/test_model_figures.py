"""Per model version figures from successive broker statistics: rates from the previous
reading, percentiles and recent batch sizes over the window, states and instance counts from
the snapshot, a reload starting the window afresh."""

from __future__ import annotations

import orjson
import pytest

from shoal.messages import (
    LATENCY_BUCKET_BOUNDS_US,
    BatchStat,
    Duration,
    LatencyHistogram,
    ModelLoadStats,
    ModelStats,
    ModelVersionInfo,
    ModelVersionState,
    RepositorySnapshot,
)
from shoal.ops.model_figures import ModelFigures, configured_instances

SLOTS = len(LATENCY_BUCKET_BOUNDS_US) + 1


def hist(**at_bound: int) -> LatencyHistogram:
    """``hist(b1000=5)``: 5 durations in the bucket whose upper bound is 1000 µs."""
    counts = [0] * SLOTS
    for name, count in at_bound.items():
        counts[LATENCY_BUCKET_BOUNDS_US.index(int(name[1:]))] += count
    return LatencyHistogram(counts)


def reading(success: int, fail: int = 0, rejected: int = 0, *, rows: int | None = None,
            request: LatencyHistogram | None = None, queue: LatencyHistogram | None = None,
            compute: LatencyHistogram | None = None, batches: dict[int, int] | None = None,
            pending: int = 0, in_flight: int = 0, restarts: dict[str, int] | None = None
            ) -> ModelStats:
    zero = Duration(0, 0)
    return ModelStats(
        name="mlp", version=1, last_inference_ms=0,
        inference_count=success if rows is None else rows, execution_count=0,
        success=Duration(success, 0), fail=Duration(fail, 0), queue=zero, compute_input=zero,
        compute_infer=zero, compute_output=zero,
        batch_stats=[BatchStat(size, Duration(n, 0), Duration(n, 0), Duration(n, 0))
                     for size, n in (batches or {}).items()],
        pending=pending, fail_by_reason={"REJECTED": rejected} if rejected else {},
        in_flight=in_flight, request_latency=request or LatencyHistogram(),
        queue_latency=queue or LatencyHistogram(), compute_latency=compute or LatencyHistogram(),
        instance_restarts=restarts or {})


def info(name: str = "mlp", state: ModelVersionState = ModelVersionState.READY,
         config: dict[str, object] | None = None, platform: str = "pytorch_libtorch"
         ) -> ModelVersionInfo:
    config = config or {"name": name, "instance_group": [{"kind": "KIND_CPU", "count": 2}]}
    return ModelVersionInfo(name, 1, state, "", platform, 8, [], [], False, orjson.dumps(config))


def snapshot(*infos: ModelVersionInfo, loads: list[ModelLoadStats] | None = None
             ) -> RepositorySnapshot:
    return RepositorySnapshot(list(infos), True, load_stats=loads or [])


def test_rates_come_from_the_previous_reading() -> None:
    figures = ModelFigures()
    snap = snapshot(info())
    first = figures.update(100.0, [reading(100, rows=400)], snap)[0]
    assert first.requests_per_s == 0.0  # nothing to compare with yet
    second = figures.update(102.0, [reading(160, fail=4, rejected=3, rows=640)], snap)[0]
    assert second.requests_per_s == pytest.approx((164 - 100) / 2)
    assert second.inferences_per_s == pytest.approx((640 - 400) / 2)
    assert second.errors_per_s == pytest.approx(2.0)
    assert (second.success_count, second.fail_count, second.rejections) == (160, 4, 3)
    assert second.fail_by_reason == {"REJECTED": 3}


def test_state_instances_queue_and_load_events() -> None:
    figures = ModelFigures()
    loads = [ModelLoadStats("mlp", 2, 1, 0, 0.25)]
    row = figures.update(1.0, [reading(0, pending=7, in_flight=2, restarts={"mlp_0": 1})],
                         snapshot(info(state=ModelVersionState.LOADING), loads=loads))[0]
    assert (row.name, row.version, row.state, row.instances) == ("mlp", 1, "LOADING", 2)
    assert (row.queue_depth, row.in_flight, row.instance_restarts) == (7, 2, {"mlp_0": 1})
    assert (row.loads, row.load_failures, row.last_load_seconds) == (2, 1, 0.25)


def test_a_version_without_statistics_is_listed_from_the_snapshot() -> None:
    row = ModelFigures().update(1.0, [], snapshot(info(name="other")))[0]
    assert row.name == "other" and row.state == "READY" and row.requests_per_s == 0.0
    assert row.latency.count == 0 and row.latency.request_p99_us is None


def test_latency_percentiles_cover_only_the_window() -> None:
    figures = ModelFigures(window_s=10.0)
    snap = snapshot(info())
    # since load: 1000 fast requests; then, within the last 10 s, 100 slow ones
    figures.update(0.0, [reading(1000, request=hist(b100=1000), queue=hist(b20=1000),
                                 compute=hist(b70=1000))], snap)
    figures.update(5.0, [reading(1000, request=hist(b100=1000), queue=hist(b20=1000),
                                 compute=hist(b70=1000))], snap)
    row = figures.update(11.0, [reading(1100, request=hist(b100=1000, b5000=100),
                                        queue=hist(b20=1000, b3000=100),
                                        compute=hist(b70=1000, b1500=100))], snap)[0]
    # the oldest reading kept is the last one at or before 11 - 10 = 1 s: the one at 0 s
    assert row.latency.window_s == pytest.approx(11.0)
    assert row.latency.count == 100
    assert row.latency.request_p50_us is not None and 3000 < row.latency.request_p50_us <= 5000
    assert row.latency.queue_p99_us is not None and 2000 < row.latency.queue_p99_us <= 3000
    assert row.latency.compute_p50_us is not None and 1000 < row.latency.compute_p50_us <= 1500
    later = figures.update(16.0, [reading(1100, request=hist(b100=1000, b5000=100))], snap)[0]
    assert later.latency.window_s == pytest.approx(11.0)  # now from the reading at 5 s
    assert later.latency.count == 100


def test_recent_batch_sizes_are_counted_over_the_window() -> None:
    figures = ModelFigures(window_s=10.0)
    snap = snapshot(info())
    figures.update(0.0, [reading(10, batches={1: 10})], snap)
    row = figures.update(3.0, [reading(50, batches={1: 10, 8: 5})], snap)[0]
    assert [(b.batch_size, b.executions, b.recent) for b in row.batch_sizes] == [
        (1, 10, 0), (8, 5, 5)]


def test_counters_going_down_start_the_window_afresh() -> None:
    figures = ModelFigures()
    snap = snapshot(info())
    figures.update(0.0, [reading(500, request=hist(b100=500))], snap)
    row = figures.update(1.0, [reading(3, request=hist(b7000=3))], snap)[0]  # reloaded
    assert row.requests_per_s == 0.0
    assert row.latency.count == 3  # since the reload, not a negative delta
    assert row.latency.request_p50_us is not None and row.latency.request_p50_us > 5000


def test_configured_instances_from_the_completed_config() -> None:
    def count(groups: list[dict[str, object]], platform: str = "") -> int:
        return configured_instances(orjson.dumps({"platform": platform,
                                                  "instance_group": groups}))

    assert count([{"kind": "KIND_CPU", "count": 3}]) == 3
    assert count([{"kind": "KIND_GPU", "count": 2, "gpus": [0, 1]},
                  {"kind": "KIND_CPU", "count": 1}]) == 5
    assert count([], platform="ensemble") == 0
    assert configured_instances(b"not json") == 0
