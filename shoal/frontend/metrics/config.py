"""What the metrics port shows, from ``--metrics-config``, ``--allow-gpu-metrics`` and
``--metrics-interval-ms`` (tritonserver's flags and settings).

``--metrics-config SETTING=VALUE`` (repeatable), as Triton's global group:
  counter_latencies=true|false    the cumulative ``nv_inference_*_duration_us`` counters (true)
  histogram_latencies=true|false  ``nv_inference_first_response_histogram_ms`` (false)
  summary_latencies=true|false    the ``nv_inference_*_summary_us`` summaries (false)
  summary_quantiles=Q:E,Q:E,...   the summaries' quantiles (Triton's five by default); the error
                                  E is accepted and not used (quantiles come from histograms)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from shoal.settings import FrontendSettings

DEFAULT_QUANTILES: Final[tuple[tuple[float, float], ...]] = (
    (0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
SUMMARY_MAX_AGE_S: Final = 60.0  # prometheus-cpp's Summary default, which Triton keeps
SETTINGS: Final = ("counter_latencies", "histogram_latencies", "summary_latencies",
                   "summary_quantiles")


@dataclass(frozen=True)
class MetricsConfig:
    counter_latencies: bool = True
    histogram_latencies: bool = False
    summary_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    allow_gpu_metrics: bool = True
    allow_cpu_metrics: bool = True  # the host CPU and memory gauges (nv_cpu_*)
    interval_s: float = 2.0  # per-interval metrics: GPU readings, summary windows
    response_cache: bool = False  # the server has a response cache: nv_cache_* families

    @staticmethod
    def from_settings(settings: FrontendSettings) -> MetricsConfig:
        return MetricsConfig(
            counter_latencies=settings.metrics.counter_latencies,
            histogram_latencies=settings.metrics.histogram_latencies,
            summary_latencies=settings.metrics.summary_latencies,
            summary_quantiles=tuple(settings.metrics.summary_quantiles),
            allow_gpu_metrics=settings.metrics.allow_gpu,
            allow_cpu_metrics=settings.metrics.allow_cpu,
            interval_s=settings.metrics.interval_ms / 1000.0,
            response_cache=settings.response_cache_bytes > 0)


def _bool(setting: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"--metrics-config {setting} expects true or false, got '{text}'")


def parse_quantiles(text: str) -> list[tuple[float, float]]:
    """``0.5:0.05,0.9:0.01`` -> [(0.5, 0.05), (0.9, 0.01)]; each quantile and error in [0, 1]."""
    pairs: list[tuple[float, float]] = []
    for part in text.split(","):
        quantile, sep, error = part.strip().partition(":")
        try:
            pair = (float(quantile), float(error))
        except ValueError:
            pair = (-1.0, -1.0)
        if not sep or not all(0.0 <= v <= 1.0 for v in pair):
            raise ValueError("--metrics-config summary_quantiles expects <quantile>:<error>[,...] "
                             f"with both in [0, 1], got '{part.strip()}'")
        pairs.append(pair)
    return pairs


def parse_metrics_config(values: Sequence[str]) -> dict[str, Any]:
    """``SETTING=VALUE`` strings -> the ``Settings`` fields they set (later ones win). Raises
    ValueError naming the setting."""
    fields: dict[str, Any] = {}
    for text in values:
        setting, sep, value = text.partition("=")
        setting = setting.strip()
        if not sep or setting not in SETTINGS:
            raise ValueError(f"--metrics-config expects <setting>=<value> with a setting of "
                             f"{', '.join(SETTINGS)}; got '{text}'")
        if setting == "summary_quantiles":
            fields["metrics_summary_quantiles"] = tuple(parse_quantiles(value))
        else:
            fields[f"metrics_{setting}"] = _bool(setting, value)
    return fields
