"""Prometheus metrics in Triton's names and label conventions (``GET :8002/metrics``).

Per model version (labels ``model``, ``version``): request success / failure (by ``reason``)
counts, inference and execution counts, pending requests, and cumulative durations in
microseconds. Counters carry no ``_total`` suffix (prometheus-cpp, as Triton). Process-wide CPU
gauges come from psutil. The text is rendered from the broker's statistics on each scrape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Final

import psutil  # type: ignore[import-untyped]
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from shoal.errors import ShoalError
from shoal.messages import ModelLoadStats, ModelStats, ModelVersionState, RepositorySnapshot

if TYPE_CHECKING:
    from shoal.frontend.dataplane import DataPlane

logger = logging.getLogger(__name__)

CONTENT_TYPE: Final = "text/plain; charset=utf-8"
FAILURE_REASONS: Final = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

# (name, type, help, value of one model version)
_Family = tuple[str, str, str, Callable[[ModelStats], int]]
_FAMILIES: Final[tuple[_Family, ...]] = (
    ("nv_inference_request_success", "counter",
     "Number of successful inference requests, all batch sizes", lambda s: s.success.count),
    ("nv_inference_count", "counter",
     "Number of inferences performed (does not include cached requests)",
     lambda s: s.inference_count),
    ("nv_inference_exec_count", "counter",
     "Number of model executions performed (does not include cached requests)",
     lambda s: s.execution_count),
    ("nv_inference_pending_request_count", "gauge",
     "Instantaneous number of pending requests awaiting execution per-model.",
     lambda s: s.pending),
    ("nv_inference_request_duration_us", "counter",
     "Cumulative inference request duration in microseconds (includes cached requests)",
     lambda s: s.success.ns // 1000),
    ("nv_inference_queue_duration_us", "counter",
     "Cumulative inference queuing duration in microseconds (includes cached requests)",
     lambda s: s.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us", "counter",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     lambda s: s.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us", "counter",
     "Cumulative compute inference duration in microseconds (does not include cached requests)",
     lambda s: s.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us", "counter",
     "Cumulative inference compute output duration in microseconds (does not include cached "
     "requests)", lambda s: s.compute_output.ns // 1000),
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(stats: ModelStats, extra: str = "") -> str:
    return f'{{model="{_label(stats.name)}",version="{stats.version}"{extra}}}'


def failures_by_reason(stats: ModelStats) -> dict[str, int]:
    """Triton's four reasons, always present; failures the broker did not classify are OTHER."""
    counts = {reason: 0 for reason in FAILURE_REASONS}
    for reason, count in stats.fail_by_reason.items():
        counts[reason] = counts.get(reason, 0) + count
    unclassified = stats.fail.count - sum(counts.values())
    if unclassified > 0:
        counts["OTHER"] += unclassified
    return counts


def _header(lines: list[str], name: str, kind: str, text: str) -> None:
    lines.append(f"# HELP {name} {text}")
    lines.append(f"# TYPE {name} {kind}")


def _model_lines(stats: Sequence[ModelStats]) -> Iterable[str]:
    lines: list[str] = []
    if not stats:
        return lines
    ordered = sorted(stats, key=lambda s: (s.name, s.version))
    name, kind, text, value = _FAMILIES[0]
    _header(lines, name, kind, text)
    lines.extend(f"{name}{_labels(s)} {value(s)}" for s in ordered)
    _header(lines, "nv_inference_request_failure", "counter",
            "Number of failed inference requests, all batch sizes")
    for s in ordered:
        for reason, count in failures_by_reason(s).items():
            extra = f',reason="{_label(reason)}"'
            lines.append(f"nv_inference_request_failure{_labels(s, extra)} {count}")
    for name, kind, text, value in _FAMILIES[1:]:
        _header(lines, name, kind, text)
        lines.extend(f"{name}{_labels(s)} {value(s)}" for s in ordered)
    return lines


def _cpu_lines() -> list[str]:
    memory = psutil.virtual_memory()
    lines: list[str] = []
    _header(lines, "nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]")
    lines.append(f"nv_cpu_utilization {psutil.cpu_percent(interval=None) / 100.0}")
    _header(lines, "nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes")
    lines.append(f"nv_cpu_memory_total_bytes {memory.total}")
    _header(lines, "nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes")
    lines.append(f"nv_cpu_memory_used_bytes {memory.total - memory.available}")
    return lines


def _lifecycle_lines(snapshot: RepositorySnapshot | None) -> list[str]:
    """Model state per version (one series per state, 1 for the current one) and load events
    per model."""
    lines: list[str] = []
    if snapshot is None or not (snapshot.models or snapshot.load_stats):
        return lines
    _header(lines, "shoal_model_state", "gauge",
            "Model version state: 1 for the current state, 0 for the others")
    for info in sorted(snapshot.models, key=lambda i: (i.name, i.version)):
        for state in ModelVersionState:
            extra = f',state="{state.value}"'
            labels = f'{{model="{_label(info.name)}",version="{info.version}"{extra}}}'
            lines.append(f"shoal_model_state{labels} {int(info.state is state)}")
    families: tuple[tuple[str, str, str, Callable[[ModelLoadStats], float]], ...] = (
        ("shoal_model_loads", "counter", "Successful loads and reloads of the model",
         lambda s: s.loads),
        ("shoal_model_load_failures", "counter", "Failed loads and reloads of the model",
         lambda s: s.failures),
        ("shoal_model_unloads", "counter", "Unloads of the model", lambda s: s.unloads),
        ("shoal_model_last_load_duration_seconds", "gauge",
         "Seconds from the load request to ready, for the last successful load",
         lambda s: s.last_load_seconds),
    )
    for name, kind, text, value in families:
        _header(lines, name, kind, text)
        lines.extend(f'{name}{{model="{_label(s.name)}"}} {value(s)}'
                     for s in snapshot.load_stats)
    return lines


def render_prometheus(stats: Sequence[ModelStats],
                      snapshot: RepositorySnapshot | None = None) -> str:
    """The Prometheus text exposition of ``stats``, the model lifecycle of ``snapshot`` and
    the CPU gauges."""
    lines = [*_model_lines(stats), *_lifecycle_lines(snapshot), *_cpu_lines()]
    return "\n".join(lines) + "\n"


def create_metrics_app(dataplane: DataPlane, extra_routes: Sequence[BaseRoute] = ()) -> Starlette:
    """``GET /metrics`` and ``/metrics/``, and ``extra_routes`` (the ops dashboard). Like
    Triton's metrics port: another method is 405 ``{"error":"Method Not Allowed"}``; any other
    path is 400 with an empty body."""

    async def metrics(request: Request) -> Response:
        models: Sequence[ModelStats] = ()
        try:
            reply = await dataplane.stats("", -1)
        except ShoalError as error:
            logger.debug("metrics without model statistics: %s", error.message)
        else:
            if reply.error is None:
                models = reply.models
            else:
                logger.debug("metrics without model statistics: %s", reply.error.message)
        return PlainTextResponse(render_prometheus(models, dataplane.snapshot),
                                 media_type=CONTENT_TYPE)

    async def other(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException) and exc.status_code == 405:
            return Response(b'{"error":"Method Not Allowed"}', 405,
                            media_type="application/json")
        return PlainTextResponse("", 400, media_type=CONTENT_TYPE)

    app = Starlette(
        routes=[Route("/metrics", metrics, methods=["GET"]),
                Route("/metrics/", metrics, methods=["GET"]), *extra_routes],
        exception_handlers={HTTPException: other},
    )
    app.router.redirect_slashes = False
    return app
