"""``pb_utils.MetricFamily`` and ``pb_utils.Metric``: Triton's python-backend custom metrics API
over the worker's registry (``shoal/workers/custom_metrics.py``).

As Triton: ``MetricFamily(name, description, kind)`` with ``kind`` COUNTER, GAUGE or HISTOGRAM;
``family.Metric(labels=None, buckets=None)`` (buckets required for a histogram); a counter
supports ``increment`` (not negative) and ``value``, a gauge ``increment``, ``set`` and ``value``,
a histogram ``observe`` only. A family or labels asked for twice are the same one. A ``Metric``
lives until its object is garbage-collected; deleting its ``MetricFamily`` first invalidates it.
Errors raise ``TritonModelException`` with Triton's texts. Values reach ``GET :8002/metrics``
within about a second (the worker's heartbeat), labelled only with the model's own labels.
Unlike Triton, ``value()`` reads this instance's value: instances of a model each keep theirs
(the metrics endpoint shows their sum).
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Sequence
from typing import Any

from shoal.messages import CustomMetricKind
from shoal.workers.backends.python.pb_tensor import TritonModelException
from shoal.workers.custom_metrics import (
    REGISTRY,
    CustomMetricsRegistry,
    Family,
    MetricError,
    Series,
)

_CLEARED = ("Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
            "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects "
            "have been deleted.")


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


_KINDS = {MetricKind.COUNTER: CustomMetricKind.COUNTER, MetricKind.GAUGE: CustomMetricKind.GAUGE,
          MetricKind.HISTOGRAM: CustomMetricKind.HISTOGRAM}


class _Handle:
    """A Metric object's hold on its series; released once (by the Metric or its family)."""

    def __init__(self, registry: CustomMetricsRegistry, family: Family, series: Series) -> None:
        self.registry, self.family, self.series = registry, family, series
        self.cleared = False

    def release(self) -> None:
        if not self.cleared:
            self.cleared = True
            self.registry.close_series(self.family, self.series)


def _release_metric(handle: _Handle, owners: set[_Handle]) -> None:
    handle.release()
    owners.discard(handle)


def _release_family(registry: CustomMetricsRegistry, family: Family,
                    handles: set[_Handle]) -> None:
    for handle in list(handles):
        handle.release()
    handles.clear()
    registry.close_family(family)


class Metric:
    """One labelled series of a ``MetricFamily`` (made by ``MetricFamily.Metric``)."""

    def __init__(self, handle: _Handle, owners: set[_Handle]) -> None:
        self._handle = handle
        weakref.finalize(self, _release_metric, handle, owners)

    def _run(self, what: str, operation: Any, *args: float) -> Any:
        handle = self._handle
        if handle.cleared:
            raise TritonModelException(f"Failed to {what}: {_CLEARED}")
        try:
            return operation(handle.family, handle.series, *args)
        except MetricError as exc:
            raise TritonModelException(f"Failed to {what}: {exc}") from None

    def increment(self, value: float) -> None:
        self._run("increment metric value", self._handle.registry.increment, float(value))

    def set(self, value: float) -> None:
        self._run("set metric value", self._handle.registry.set, float(value))

    def observe(self, value: float) -> None:
        self._run("observe metric value", self._handle.registry.observe, float(value))

    def value(self) -> float:
        return float(self._run("get metric value", self._handle.registry.value))


class MetricFamily:
    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        if name is None or description is None or kind is None:
            raise TypeError("MetricFamily(): name, description and kind may not be None")
        try:
            metric_kind = _KINDS[MetricKind(kind)]
        except ValueError:
            raise TritonModelException(
                f"Error when creating MetricFamily: unknown metric kind {kind!r}") from None
        try:
            self._family = REGISTRY.open_family(str(name), str(description), metric_kind)
        except MetricError as exc:
            raise TritonModelException(f"Error when creating MetricFamily: {exc}") from None
        self._handles: set[_Handle] = set()
        weakref.finalize(self, _release_family, REGISTRY, self._family, self._handles)

    def Metric(self, labels: dict[str, str] | None = None,  # Triton's method name
               buckets: Sequence[float] | None = None) -> Metric:
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        try:
            series = REGISTRY.open_series(self._family, labels or {}, buckets)
        except MetricError as exc:
            raise TritonModelException(f"Error when creating Metric: {exc}") from None
        handle = _Handle(REGISTRY, self._family, series)
        self._handles.add(handle)
        return Metric(handle, self._handles)
