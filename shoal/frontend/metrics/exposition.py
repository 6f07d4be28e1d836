"""Prometheus text exposition (format 0.0.4) of prometheus-client metric families.

Gauges, histograms and summaries go through prometheus-client's own writer: ``generate_latest``
over a ``CollectorRegistry`` whose custom collector yields them. Counters cannot: Triton's
counters have no ``_total`` suffix (``nv_inference_count``, prometheus-cpp's naming), and
prometheus-client (0.26, checked) always writes a counter family as ``<name>_total`` in
its ``# HELP``/``# TYPE`` lines, and a ``CounterMetricFamily``'s samples as ``<name>_total`` too;
a counter built with the sample name kept (``Metric(name, help, "counter")``) comes out with
``# TYPE <name>_total counter`` above ``<name> 12`` samples, which names two families. So counter
families are written here, by hand, in the same format: ``# HELP``/``# TYPE`` under the family
name, samples with their labels in the order given, integral values without a fraction (as
prometheus-cpp writes them). Families keep the order in which they are given; a family without
samples is left out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; charset=utf-8"


class _Families(Collector):
    """A custom collector over families built for one scrape."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def number(value: float) -> str:
    """A sample value as prometheus-cpp writes it: ``12`` (not ``12.0``), ``0.25``, ``NaN``,
    ``+Inf``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _counter_text(family: Metric) -> str:
    doc = family.documentation.replace("\\", "\\\\").replace("\n", "\\n")
    lines = [f"# HELP {family.name} {doc}", f"# TYPE {family.name} counter"]
    for sample in family.samples:
        labels = ",".join(f'{key}="{escape_label(value)}"' for key, value in sample.labels.items())
        lines.append(f"{sample.name}{{{labels}}} {number(sample.value)}" if labels
                     else f"{sample.name} {number(sample.value)}")
    return "\n".join(lines) + "\n"


def counter_family(name: str, documentation: str) -> Metric:
    """A counter family whose samples are named ``name`` (no ``_total``); add samples with
    ``family.add_sample(name, labels, value)``."""
    return Metric(name, documentation, "counter")


def render(families: Iterable[Metric]) -> str:
    """The text exposition of ``families``: counters by hand, the rest by prometheus-client."""
    out: list[str] = []
    others: list[Metric] = []

    def flush() -> None:
        if others:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(_Families(list(others)))
            out.append(generate_latest(registry).decode())
            others.clear()

    for family in families:
        if not family.samples:
            continue
        if family.type == "counter":
            flush()
            out.append(_counter_text(family))
        else:
            others.append(family)
    flush()
    return "".join(out)
