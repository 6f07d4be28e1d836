"""The worker's custom metrics: families and labelled series that its model creates through
``pb_utils.MetricFamily`` (``backends/python/pb_metrics.py`` is the Triton-shaped API over this).

Values live here, in the worker. The control thread ships the whole set on its heartbeat when it
changed (``changed_since_last``); the broker merges the workers' sets and frontend 0 renders them.
Series and families are reference counted as in Triton's core: the same name (and labels) asked
for twice is the same family (series); a series goes when its last ``Metric`` object is
released, a family when its last ``MetricFamily`` object is. Thread-safe: the model may call from
any thread while the control thread reads.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from shoal.messages import CustomMetric, CustomMetricFamily, CustomMetricKind

# prometheus-cpp's name rules (Triton registers custom families in its prometheus registry)
_METRIC_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

LabelKey = tuple[tuple[str, str], ...]


class MetricError(ValueError):
    """A metric operation the kind does not allow, or a bad name, label or bucket list."""


@dataclass
class Series:
    labels: LabelKey
    buckets: tuple[float, ...] = ()
    value: float = 0.0  # counter / gauge value; histogram: sum of the observations
    counts: list[int] = field(default_factory=list)  # histogram: per bucket + overflow
    refs: int = 0


@dataclass
class Family:
    name: str
    description: str
    kind: CustomMetricKind
    series: dict[LabelKey, Series] = field(default_factory=dict)
    refs: int = 0


def _label_key(labels: Mapping[str, str]) -> LabelKey:
    for name, value in labels.items():
        if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise MetricError(f"Invalid label name: '{name}'")
        if not isinstance(value, str):
            raise MetricError(f"label '{name}' must have a string value, got "
                              f"{type(value).__name__}")
    return tuple(sorted(labels.items()))


def _check_buckets(buckets: Sequence[float]) -> tuple[float, ...]:
    bounds = tuple(float(b) for b in buckets)
    if any(math.isnan(b) for b in bounds) or any(a >= b for a, b in itertools.pairwise(bounds)):
        raise MetricError("Bucket Boundaries must be strictly sorted")
    return bounds


class CustomMetricsRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, Family] = {}
        self._changes = 0  # bumped by every change of a value or of the set
        self._shipped = -1  # _changes when changed_since_last last returned the set

    # ------------------------------------------------------------------ families and series

    def open_family(self, name: str, description: str, kind: CustomMetricKind) -> Family:
        """The family ``name`` (created, or the existing one: its description stays)."""
        if not _METRIC_NAME.fullmatch(name):
            raise MetricError(f"Invalid metric name: '{name}'")
        with self._lock:
            family = self._families.get(name)
            if family is None:
                family = self._families[name] = Family(name, description, kind)
                self._changes += 1
            elif family.kind is not kind:
                raise MetricError(f"a metric family named '{name}' exists with kind "
                                  f"{family.kind.value}, not {kind.value}")
            family.refs += 1
            return family

    def close_family(self, family: Family) -> None:
        with self._lock:
            family.refs -= 1
            if family.refs <= 0 and self._families.get(family.name) is family:
                del self._families[family.name]
                self._changes += 1

    def open_series(self, family: Family, labels: Mapping[str, str],
                    buckets: Sequence[float] | None) -> Series:
        key = _label_key(labels)
        bounds: tuple[float, ...] = ()
        if family.kind is CustomMetricKind.HISTOGRAM:
            if buckets is None:
                raise MetricError("a histogram metric needs buckets (ascending upper bounds)")
            bounds = _check_buckets(buckets)
        with self._lock:
            series = family.series.get(key)
            if series is None:  # as Triton: the same labels again are the same series
                series = family.series[key] = Series(key, bounds, counts=(
                    [0] * (len(bounds) + 1) if family.kind is CustomMetricKind.HISTOGRAM else []))
                self._changes += 1
            series.refs += 1
            return series

    def close_series(self, family: Family, series: Series) -> None:
        with self._lock:
            series.refs -= 1
            if series.refs <= 0 and family.series.get(series.labels) is series:
                del family.series[series.labels]
                self._changes += 1

    # ------------------------------------------------------------------ values

    def increment(self, family: Family, series: Series, amount: float) -> None:
        if family.kind is CustomMetricKind.HISTOGRAM:
            raise MetricError("TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment")
        if family.kind is CustomMetricKind.COUNTER and amount < 0:
            raise MetricError("TRITONSERVER_METRIC_KIND_COUNTER can only be incremented "
                              "monotonically by non-negative values.")
        with self._lock:
            series.value += amount
            self._changes += 1

    def set(self, family: Family, series: Series, value: float) -> None:
        if family.kind is not CustomMetricKind.GAUGE:
            raise MetricError(f"{_kind_name(family)} does not support Set")
        with self._lock:
            series.value = value
            self._changes += 1

    def observe(self, family: Family, series: Series, value: float) -> None:
        if family.kind is not CustomMetricKind.HISTOGRAM:
            raise MetricError(f"{_kind_name(family)} does not support Observe")
        with self._lock:
            series.counts[bisect.bisect_left(series.buckets, value)] += 1  # le: bound inclusive
            series.value += value
            self._changes += 1

    def value(self, family: Family, series: Series) -> float:
        if family.kind is CustomMetricKind.HISTOGRAM:
            raise MetricError("TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value")
        with self._lock:
            return series.value

    # ------------------------------------------------------------------ shipping

    def snapshot(self) -> list[CustomMetricFamily]:
        with self._lock:
            return self._snapshot()

    def changed_since_last(self) -> list[CustomMetricFamily] | None:
        """Every family and series now, if anything changed since the last call that returned
        them (the first call returns them when any exist); None otherwise."""
        with self._lock:
            if self._changes == self._shipped or (self._shipped < 0 and not self._families):
                return None
            self._shipped = self._changes
            return self._snapshot()

    def _snapshot(self) -> list[CustomMetricFamily]:
        return [
            CustomMetricFamily(family.name, family.description, family.kind, [
                CustomMetric(list(series.labels), series.value, list(series.buckets),
                             list(series.counts))
                for series in family.series.values()
            ])
            for family in self._families.values()
        ]


def _kind_name(family: Family) -> str:
    return f"TRITONSERVER_METRIC_KIND_{family.kind.value.upper()}"


# The worker process's registry (one model instance per worker).
REGISTRY: Final = CustomMetricsRegistry()
