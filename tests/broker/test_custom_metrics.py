"""Merging the workers' custom metrics into one set for the metrics endpoint."""

from __future__ import annotations

from shoal.broker.custom_metrics import merge_custom_metrics
from shoal.messages import CustomMetric, CustomMetricFamily, CustomMetricKind

COUNTER, GAUGE, HISTOGRAM = CustomMetricKind.COUNTER, CustomMetricKind.GAUGE, \
    CustomMetricKind.HISTOGRAM


def family(name: str, kind: CustomMetricKind, *metrics: CustomMetric,
           description: str = "d") -> CustomMetricFamily:
    return CustomMetricFamily(name, description, kind, list(metrics))


def test_instances_of_a_model_add_up() -> None:
    worker_a = [family("seen", COUNTER, CustomMetric([("k", "x")], 2.0)),
                family("depth", GAUGE, CustomMetric([], 3.0)),
                family("lat", HISTOGRAM, CustomMetric([], 1.5, [1.0, 2.0], [1, 1, 0]))]
    worker_b = [family("seen", COUNTER, CustomMetric([("k", "x")], 5.0),
                       CustomMetric([("k", "y")], 1.0)),
                family("depth", GAUGE, CustomMetric([], 4.0)),
                family("lat", HISTOGRAM, CustomMetric([], 9.0, [1.0, 2.0], [0, 0, 2]))]
    merged = {f.name: f for f in merge_custom_metrics([worker_a, worker_b])}
    assert [(m.labels, m.value) for m in merged["seen"].metrics] == [
        ([("k", "x")], 7.0), ([("k", "y")], 1.0)]
    assert merged["depth"].metrics[0].value == 7.0
    lat = merged["lat"].metrics[0]
    assert (lat.value, lat.counts, lat.buckets) == (10.5, [1, 1, 2], [1.0, 2.0])


def test_conflicts_keep_the_first_worker() -> None:
    first = [family("x", COUNTER, CustomMetric([], 1.0), description="first"),
             family("h", HISTOGRAM, CustomMetric([], 1.0, [1.0], [1, 0]))]
    second = [family("x", GAUGE, CustomMetric([], 50.0), description="second"),
              family("h", HISTOGRAM, CustomMetric([], 1.0, [5.0], [1, 0]))]
    merged = {f.name: f for f in merge_custom_metrics([first, second])}
    assert (merged["x"].kind, merged["x"].description, merged["x"].metrics[0].value) == (
        COUNTER, "first", 1.0)
    assert merged["h"].metrics[0].buckets == [1.0] and merged["h"].metrics[0].counts == [1, 0]


def test_no_workers_no_metrics() -> None:
    assert merge_custom_metrics([]) == []
    assert merge_custom_metrics([[], []]) == []
