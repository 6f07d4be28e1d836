"""``pb_utils.MetricFamily`` / ``Metric`` (Triton's python-backend custom metrics API) over the
worker's registry, and what the heartbeat ships."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from shoal.messages import CustomMetricKind
from shoal.workers.backends.python import pb_utils
from shoal.workers.custom_metrics import REGISTRY


@pytest.fixture(autouse=True)
def empty_registry() -> Iterator[None]:
    gc.collect()
    REGISTRY.changed_since_last()  # forget what earlier tests shipped
    yield
    gc.collect()


def shipped() -> dict[str, dict[tuple[tuple[str, str], ...], object]]:
    return {f.name: {tuple(m.labels): m for m in f.metrics} for f in REGISTRY.snapshot()}


def test_counter_as_triton() -> None:
    family = pb_utils.MetricFamily("requests_total_x", "requests", pb_utils.MetricFamily.COUNTER)
    metric = family.Metric(labels={"example1": "a", "example2": "b"})
    assert metric.value() == 0.0
    metric.increment(2023.0)
    assert metric.value() == 2023.0
    with pytest.raises(pb_utils.TritonModelException, match="non-negative"):
        metric.increment(-23.5)
    with pytest.raises(pb_utils.TritonModelException, match="does not support Set"):
        metric.set(999.9)
    with pytest.raises(pb_utils.TritonModelException, match="does not support Observe"):
        metric.observe(0.05)


def test_gauge_as_triton() -> None:
    family = pb_utils.MetricFamily("gauge_x", "gauge", pb_utils.MetricFamily.GAUGE)
    metric = family.Metric(labels={"k": "v"})
    metric.increment(2023.0)
    metric.increment(-23.5)
    assert metric.value() == 1999.5
    metric.set(999.9)
    assert metric.value() == 999.9
    with pytest.raises(pb_utils.TritonModelException):
        metric.observe(1.0)


def test_histogram_as_triton() -> None:
    family = pb_utils.MetricFamily("hist_x", "histogram", pb_utils.MetricFamily.HISTOGRAM)
    with pytest.raises(pb_utils.TritonModelException):
        family.Metric(labels={})  # buckets are required
    with pytest.raises(pb_utils.TritonModelException, match="strictly sorted"):
        family.Metric(labels={}, buckets=[2.5, 0.1, 1.0])
    with pytest.raises(pb_utils.TritonModelException, match="strictly sorted"):
        family.Metric(labels={}, buckets=[1, 1, 2])
    family.Metric(labels={"empty": "1"}, buckets=[])  # allowed, as Triton
    metric = family.Metric(labels={"l": "x"}, buckets=[0.1, 1.0, 2.5, 5.0, 10.0])
    for datum in (0.05, 1.5, 6.0, 1.0):
        metric.observe(datum)
    for operation in (metric.value, lambda: metric.increment(1.0), lambda: metric.set(1.0)):
        with pytest.raises(pb_utils.TritonModelException):
            operation()
    series = shipped()["hist_x"][(("l", "x"),)]
    assert series.counts == [1, 1, 1, 0, 1, 0]  # type: ignore[attr-defined]
    assert series.value == pytest.approx(8.55)  # type: ignore[attr-defined]


def test_same_family_and_labels_are_the_same_series() -> None:
    first = pb_utils.MetricFamily("dup_x", "first description", pb_utils.MetricFamily.COUNTER)
    second = pb_utils.MetricFamily("dup_x", "second description", pb_utils.MetricFamily.COUNTER)
    a = first.Metric(labels={"k": "1"})
    b = second.Metric(labels={"k": "1"})
    a.increment(7.5)
    assert b.value() == 7.5
    del a
    gc.collect()
    assert b.value() == 7.5  # b still holds the series
    families = {f.name: f for f in REGISTRY.snapshot()}
    assert families["dup_x"].description == "first description"
    with pytest.raises(pb_utils.TritonModelException, match="exists with kind counter"):
        pb_utils.MetricFamily("dup_x", "other kind", pb_utils.MetricFamily.GAUGE)


def test_released_metrics_and_families_leave_the_registry() -> None:
    family = pb_utils.MetricFamily("gone_x", "g", pb_utils.MetricFamily.GAUGE)
    metric = family.Metric(labels={"k": "v"})
    metric.set(1.0)
    assert (("k", "v"),) in shipped()["gone_x"]
    del metric
    gc.collect()
    assert shipped()["gone_x"] == {}
    del family
    gc.collect()
    assert "gone_x" not in shipped()


def test_a_metric_outliving_its_family_is_invalid() -> None:
    family = pb_utils.MetricFamily("lifetime_x", "l", pb_utils.MetricFamily.GAUGE)
    metric = family.Metric(labels={"k": "v"})
    del family
    gc.collect()
    for operation in (lambda: metric.set(10), lambda: metric.increment(10), metric.value):
        with pytest.raises(pb_utils.TritonModelException, match="'MetricFamily' has been "
                           "deleted"):
            operation()


def test_bad_names_and_labels_are_refused() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="Invalid metric name"):
        pb_utils.MetricFamily("bad name", "x", pb_utils.MetricFamily.COUNTER)
    family = pb_utils.MetricFamily("labels_x", "x", pb_utils.MetricFamily.COUNTER)
    with pytest.raises(pb_utils.TritonModelException, match="Labels must be a dictionary"):
        family.Metric(labels=["a"])  # type: ignore[arg-type]
    with pytest.raises(pb_utils.TritonModelException, match="Invalid label name"):
        family.Metric(labels={"bad-label": "x"})
    with pytest.raises(pb_utils.TritonModelException, match="string value"):
        family.Metric(labels={"n": 3})  # type: ignore[dict-item]
    with pytest.raises(pb_utils.TritonModelException, match="unknown metric kind"):
        pb_utils.MetricFamily("kind_x", "x", 7)  # type: ignore[arg-type]


def test_heartbeat_ships_the_set_only_when_it_changed() -> None:
    family = pb_utils.MetricFamily("beat_x", "b", pb_utils.MetricFamily.COUNTER)
    metric = family.Metric(labels={})
    first = REGISTRY.changed_since_last()
    assert first is not None and any(f.name == "beat_x" for f in first)
    assert REGISTRY.changed_since_last() is None
    metric.increment(1)
    again = REGISTRY.changed_since_last()
    assert again is not None
    beat = next(f for f in again if f.name == "beat_x")
    assert beat.kind is CustomMetricKind.COUNTER and beat.metrics[0].value == 1.0
