"""The metrics port (frontend 0): ``GET /metrics``, the per-interval poller, and the exposition
of everything the port shows (``render_prometheus``).

Every figure is global to the server whatever ``--http-workers`` is: model statistics and custom
metrics come from the broker (which sees every frontend's requests), the lifecycle from its
snapshot, CPU and GPU readings from the host. No counter is kept per frontend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from shoal.errors import ShoalError
from shoal.frontend.metrics.cache import cache_families
from shoal.frontend.metrics.config import SUMMARY_MAX_AGE_S, MetricsConfig
from shoal.frontend.metrics.custom import custom_families
from shoal.frontend.metrics.device_ledger import device_ledger_families
from shoal.frontend.metrics.exposition import CONTENT_TYPE, render
from shoal.frontend.metrics.families import (
    cpu_families,
    lifecycle_families,
    model_families,
    pinned_memory_families,
)
from shoal.frontend.metrics.gpu import GpuReading, NvmlReader, gpu_families
from shoal.frontend.metrics.latency import (
    SummaryWindows,
    first_response_family,
    summary_families,
)
from shoal.frontend.metrics.llm import llm_families
from shoal.messages import (
    CustomMetricFamily,
    DeviceMemory,
    ModelStats,
    RepositorySnapshot,
    StatsReply,
)
from shoal.settings import FrontendSettings

if TYPE_CHECKING:
    from shoal.frontend.core.dataplane import DataPlane

logger = logging.getLogger(__name__)


def render_prometheus(stats: Sequence[ModelStats], snapshot: RepositorySnapshot | None = None,
                      *, config: MetricsConfig | None = None,
                      custom: Sequence[CustomMetricFamily] = (),
                      gpus: Sequence[GpuReading] = (), windows: SummaryWindows | None = None,
                      now: float | None = None, devices: Sequence[DeviceMemory] = ()) -> str:
    """The text exposition: per-version families of ``stats``, the latency histogram and
    summaries as ``config`` asks (summary quantiles over ``windows`` at ``now``), the lifecycle
    of ``snapshot``, the pinned-memory pool (none), CPU, the ``gpus`` readings, the
    device-memory ledger's ``devices`` and the models' ``custom`` families."""
    config = config or MetricsConfig()
    families: list[Metric] = [*model_families(stats, config.counter_latencies)]
    if config.histogram_latencies:
        decoupled = {(i.name, i.version) for i in snapshot.models if i.decoupled} \
            if snapshot is not None else set()
        families.extend(first_response_family(stats, decoupled))
    if config.summary_latencies:
        families.extend(summary_families(stats, config.summary_quantiles, windows,
                                         time.monotonic() if now is None else now))
    families.extend(llm_families(stats))
    if config.response_cache:
        families.extend(cache_families(stats, snapshot))
    families.extend(lifecycle_families(snapshot))
    families.extend(pinned_memory_families())
    if config.allow_cpu_metrics:
        families.extend(cpu_families())
    if config.allow_gpu_metrics:
        families.extend(gpu_families(gpus))
    families.extend(device_ledger_families(devices))
    families.extend(custom_families(custom, {family.name for family in families}))
    return render(families)


class MetricsPoller:
    """The per-interval work, every ``config.interval_s`` on the frontend's event loop: GPU
    readings (NVML, in a thread) and, with summaries, a reading of the broker's histograms for
    the summary windows. Started by ``ensure_started`` from within the loop."""

    def __init__(self, dataplane: DataPlane, config: MetricsConfig,
                 environ: Mapping[str, str] = os.environ) -> None:
        self.dataplane = dataplane
        self.config = config
        self.gpus: list[GpuReading] = []
        self.windows = SummaryWindows(SUMMARY_MAX_AGE_S) if config.summary_latencies else None
        self._visible_devices = environ.get("CUDA_VISIBLE_DEVICES")
        self._reader: NvmlReader | None = None
        self._task: asyncio.Task[None] | None = None

    def ensure_started(self) -> None:
        if self._task is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not in a loop yet: the first scrape starts it
        self._task = loop.create_task(self._run(), name="metrics-poller")

    async def _run(self) -> None:
        if self.config.allow_gpu_metrics:
            self._reader = await asyncio.to_thread(NvmlReader.open, self._visible_devices)
        try:
            while True:
                await self.tick()
                await asyncio.sleep(self.config.interval_s)
        finally:
            if self._reader is not None:
                self._reader.close()

    async def tick(self) -> None:
        if self._reader is not None:
            try:
                self.gpus = await asyncio.to_thread(self._reader.read)
            except Exception as exc:
                logger.warning("GPU metrics: reading NVML failed: %s", exc)
                self.gpus = []
        if self.windows is not None:
            reply = await _all_stats(self.dataplane)
            if reply is not None:
                self.windows.record(time.monotonic(), reply.models)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


async def _all_stats(dataplane: DataPlane) -> StatsReply | None:
    try:
        reply = await dataplane.stats("", -1, custom_metrics=True)
    except ShoalError as error:
        logger.debug("metrics without model statistics: %s", error.message)
        return None
    if reply.error is not None:
        logger.debug("metrics without model statistics: %s", reply.error.message)
        return None
    return reply


def _config_of(dataplane: DataPlane) -> MetricsConfig:
    settings = getattr(dataplane, "settings", None)
    return MetricsConfig.from_settings(settings) if isinstance(settings, FrontendSettings) \
        else MetricsConfig()


def _json_error(status: int, text: str) -> Response:
    return Response(f'{{"error":"{text}"}}'.encode(), status, media_type="application/json")


def create_metrics_app(dataplane: DataPlane, extra_routes: Sequence[BaseRoute] = (), *,
                       config: MetricsConfig | None = None,
                       poller: MetricsPoller | None = None) -> Starlette:
    """``GET /metrics`` and ``/metrics/``, and ``extra_routes`` (the ops dashboard). Another
    method is 405 ``{"error":"Method Not Allowed"}``; any other path (``/`` too) is 404
    ``{"error":"Not Found"}``. ``config`` defaults to the dataplane's ``settings`` (the
    frontend's: ``--metrics-config`` and the rest), else to the defaults. ``poller`` (default:
    one for ``config``) starts at once when created inside the event loop, else at the first
    scrape."""
    config = config or _config_of(dataplane)
    poller = poller or MetricsPoller(dataplane, config)
    poller.ensure_started()

    async def metrics(request: Request) -> Response:
        poller.ensure_started()
        reply = await _all_stats(dataplane)
        models: Sequence[ModelStats] = reply.models if reply is not None else ()
        custom: Iterable[CustomMetricFamily] = reply.custom_metrics if reply is not None else ()
        devices: Sequence[DeviceMemory] = reply.devices if reply is not None else ()
        # off the event loop (measured, best of 15: 3 ms for 10 versions with summaries and
        # histograms, 35 ms for 100): frontend 0's loop keeps serving meanwhile, sharing the GIL
        text = await asyncio.to_thread(
            render_prometheus, models, dataplane.snapshot, config=config, custom=list(custom),
            gpus=poller.gpus, windows=poller.windows, devices=list(devices))
        return Response(text.encode(), media_type=CONTENT_TYPE)

    async def other(request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException) and exc.status_code == 405:
            return _json_error(405, "Method Not Allowed")
        if isinstance(exc, HTTPException) and exc.status_code != 404:
            return _json_error(exc.status_code, str(exc.detail).replace('"', "'"))
        return _json_error(404, "Not Found")

    app = Starlette(
        routes=[Route("/metrics", metrics, methods=["GET"]),
                Route("/metrics/", metrics, methods=["GET"]), *extra_routes],
        exception_handlers={HTTPException: other},
    )
    app.router.redirect_slashes = False
    app.state.metrics_poller = poller
    return app
