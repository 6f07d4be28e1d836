"""Prometheus metrics on the metrics port (``GET :8002/metrics``, frontend 0), in Triton's
names and label conventions.

Modules: ``app`` (the Starlette app, the per-interval poller, ``render_prometheus``),
``families`` (per model version, lifecycle, CPU), ``latency`` (first-response histogram and
latency summaries from the broker's histograms), ``custom`` (models' ``pb_utils`` metrics),
``gpu`` (NVML readings), ``exposition`` (the text format), ``config`` (``--metrics-config``).
"""

from shoal.frontend.metrics.app import MetricsPoller, create_metrics_app, render_prometheus
from shoal.frontend.metrics.config import MetricsConfig
from shoal.frontend.metrics.exposition import CONTENT_TYPE
from shoal.frontend.metrics.families import FAILURE_REASONS, failures_by_reason

__all__ = ["CONTENT_TYPE", "FAILURE_REASONS", "MetricsConfig", "MetricsPoller",
           "create_metrics_app", "failures_by_reason", "render_prometheus"]
