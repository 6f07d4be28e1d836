"""Metric families that models create through ``pb_utils.MetricFamily`` (merged over the
workers by the broker), labelled with the model's own labels only, as Triton."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Sequence

from prometheus_client.metrics_core import Metric

from shoal.frontend.metrics.exposition import counter_family, number
from shoal.messages import CustomMetricFamily, CustomMetricKind

logger = logging.getLogger(__name__)


def custom_families(reported: Sequence[CustomMetricFamily],
                    taken: Collection[str] = ()) -> Iterator[Metric]:
    """One family per reported one; a name in ``taken`` (a server family) is left out."""
    for family in reported:
        if family.name in taken:
            logger.warning("a model's custom metric family %s has the name of a server metric; "
                           "left out", family.name)
            continue
        if family.kind is CustomMetricKind.COUNTER:
            counter = counter_family(family.name, family.description)
            for metric in family.metrics:
                counter.add_sample(family.name, dict(metric.labels), metric.value)
            yield counter
        elif family.kind is CustomMetricKind.GAUGE:
            gauge = Metric(family.name, family.description, "gauge")
            for metric in family.metrics:
                gauge.add_sample(family.name, dict(metric.labels), metric.value)
            yield gauge
        else:
            histogram = Metric(family.name, family.description, "histogram")
            for metric in family.metrics:
                labels = dict(metric.labels)
                running = 0
                for bound, count in zip([*metric.buckets, float("inf")], metric.counts,
                                        strict=True):
                    running += count
                    histogram.add_sample(f"{family.name}_bucket",
                                         {**labels, "le": number(bound)}, running)
                histogram.add_sample(f"{family.name}_count", labels, running)
                histogram.add_sample(f"{family.name}_sum", labels, metric.value)
            yield histogram
