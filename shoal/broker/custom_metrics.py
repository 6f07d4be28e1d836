"""Merge the custom metrics (``pb_utils.MetricFamily``) of the live workers into one set.

Each worker keeps its own values (``workers/custom_metrics.py``); in Triton the instances of a
model share one series per family and labels. The merge gives the same totals where it can:
counters and histograms are summed over the workers (increments and observations add up);
gauges are summed too (each instance typically sets its own share, e.g. requests running), which
differs from Triton's single shared gauge where instances set the same value. The first worker's
family (workers in identity order) fixes the kind and the description; a family of the same name
with another kind is left out, as is a histogram series whose buckets differ from the first one's.
Pure: no sockets, no clock.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from shoal.messages import CustomMetric, CustomMetricFamily, CustomMetricKind

logger = logging.getLogger(__name__)

_LabelKey = tuple[tuple[str, str], ...]


@dataclass
class _Series:
    value: float
    buckets: list[float]
    counts: list[int]


@dataclass
class _Family:
    description: str
    kind: CustomMetricKind
    series: dict[_LabelKey, _Series] = field(default_factory=dict)


def _add(family: _Family, metric: CustomMetric, name: str) -> None:
    key = tuple(metric.labels)
    seen = family.series.get(key)
    if seen is None:
        family.series[key] = _Series(metric.value, list(metric.buckets), list(metric.counts))
        return
    if family.kind is CustomMetricKind.HISTOGRAM:
        if seen.buckets != metric.buckets or len(seen.counts) != len(metric.counts):
            logger.warning("custom metric %s%s: another worker's buckets differ; left out",
                           name, dict(key))
            return
        seen.counts = [a + b for a, b in zip(seen.counts, metric.counts, strict=True)]
    seen.value += metric.value


def merge_custom_metrics(per_worker: Iterable[list[CustomMetricFamily]]
                         ) -> list[CustomMetricFamily]:
    """One family per name, one series per label set, summed over ``per_worker`` (each a
    worker's last reported set, in a stable order). Families and series come out sorted."""
    merged: dict[str, _Family] = {}
    for families in per_worker:
        for reported in families:
            family = merged.get(reported.name)
            if family is None:
                family = merged[reported.name] = _Family(reported.description, reported.kind)
            elif family.kind is not reported.kind:
                logger.warning("custom metric family %s: a worker reports it as a %s, another "
                               "as a %s; the %s is left out", reported.name, family.kind.value,
                               reported.kind.value, reported.kind.value)
                continue
            for metric in reported.metrics:
                _add(family, metric, reported.name)
    return [
        CustomMetricFamily(name, family.description, family.kind, [
            CustomMetric(list(key), series.value, series.buckets, series.counts)
            for key, series in sorted(family.series.items())
        ])
        for name, family in sorted(merged.items())
    ]
