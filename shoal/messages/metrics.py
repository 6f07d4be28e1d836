"""Custom metrics of models (``pb_utils.MetricFamily``), as they cross processes.

A worker keeps its models' metric values in-process (``workers/custom_metrics.py``) and ships the
whole set on its heartbeat whenever it changed (``Heartbeat.custom_metrics``). The broker keeps
the last set of each live worker and merges them into ``StatsReply.custom_metrics`` for an
all-models statistics query; frontend 0 renders them on ``GET :8002/metrics``. A worker's set
goes with the worker: when its model unloads (or it dies), its metrics disappear.
"""

from __future__ import annotations

import enum

import msgspec


class CustomMetricKind(enum.StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class CustomMetric(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """One labelled series. ``labels``: (name, value) sorted by name. Counter and gauge:
    ``value``. Histogram: ``value`` is the sum of the observations, ``buckets`` the upper bounds
    (ascending, without +Inf) and ``counts`` the observations per bucket, not cumulative, with one
    extra last entry for those above the last bound (``len(buckets) + 1`` entries)."""

    labels: list[tuple[str, str]]
    value: float = 0.0
    buckets: list[float] = []
    counts: list[int] = []


class CustomMetricFamily(msgspec.Struct, frozen=True, array_like=True):
    name: str
    description: str
    kind: CustomMetricKind
    metrics: list[CustomMetric]
