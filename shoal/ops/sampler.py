"""The one ops sampler: a 1 Hz asyncio task in frontend 0 (the process that serves metrics).

Each tick it asks the broker for statistics (one ``StatsRequest``, as a /metrics scrape does),
samples the process tree with psutil (``oneshot``, objects kept between ticks), stats the
instance's /dev/shm segments, and builds one ``StatsDocument``. The document is encoded to JSON
once; the dashboard page, its API and its live feed only hand out those bytes, so nothing is
computed per viewer and nothing runs on the inference path. The last ``history_s`` seconds are
kept as a ring of small points for the plots.

The history lives in frontend 0's memory: a restart of frontend 0 starts it (and the frontend
restart counts) afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import msgspec
import psutil  # type: ignore[import-untyped]

from shoal.errors import ShoalError
from shoal.messages import DeviceMemory, ModelStats, RepositorySnapshot, StatsReply
from shoal.ops.llm_figures import LlmFigures
from shoal.ops.model_figures import ModelFigures
from shoal.ops.processes import ProcessTable
from shoal.ops.schema import (
    SCHEMA_VERSION,
    ClientRegionStats,
    DeviceHolderStats,
    DeviceMemoryStats,
    HistoryDocument,
    ModelSeries,
    ModelVersionStats,
    ProcessSeries,
    ProcessStats,
    ServerInfo,
    SharedMemoryStats,
    StatsDocument,
)
from shoal.ops.shm_usage import (
    SHM_DIRECTORY,
    Owner,
    attribute_segments,
    scan_segments,
    worker_serial_prefix,
)


class _SystemRegion(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def offset(self) -> int: ...
    @property
    def byte_size(self) -> int: ...


class _CudaRegion(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def device_id(self) -> int: ...
    @property
    def byte_size(self) -> int: ...


class _Regions(Protocol):
    def status(self, name: str | None) -> Sequence[_SystemRegion]: ...
    def cuda_status(self, name: str | None) -> Sequence[_CudaRegion]: ...


class SampledServer(Protocol):
    """What the sampler reads of the frontend that serves it (its ``DataPlane``)."""

    @property
    def snapshot(self) -> RepositorySnapshot: ...
    @property
    def shared_memory(self) -> _Regions: ...
    def is_ready(self) -> bool: ...
    def is_exiting(self) -> bool: ...
    async def stats(self, model: str, version: int) -> StatsReply: ...

logger = logging.getLogger(__name__)

INTERVAL_S: Final = 1.0
HISTORY_S: Final = 600.0
MAX_SUBSCRIBERS: Final = 64  # live feeds open at once; more are refused (503)
STATS_TIMEOUT_S: Final = 2.0

_encoder = msgspec.json.Encoder()


@dataclass(frozen=True)
class _Point:
    """One tick of history: per process key (label, cpu %, rss), per model key (label, req/s,
    request p99 µs, queue depth, in flight)."""

    at: float
    processes: dict[str, tuple[str, float, int]]
    models: dict[str, tuple[str, float, float | None, int, int]]


class SubscriberLimit(Exception):
    """Too many live feeds are open."""


class Sampler:
    """Owns the latest document and the history. Runs on the frontend's event loop."""

    def __init__(self, dataplane: SampledServer, instance_id: str, *,
                 root: psutil.Process | None = None, interval_s: float = INTERVAL_S,
                 history_s: float = HISTORY_S, shm_directory: str = SHM_DIRECTORY) -> None:
        self.dataplane = dataplane
        self.instance_id = instance_id
        self.interval_s = interval_s
        self.shm_directory = shm_directory
        self.started = time.time()
        self.processes = ProcessTable(root if root is not None else psutil.Process(os.getppid()))
        self.figures = ModelFigures()
        self.llm = LlmFigures()
        self.history: deque[_Point] = deque(maxlen=max(1, int(history_s / interval_s)))
        self.latest: StatsDocument | None = None
        self.latest_json = b""
        self._history_json: tuple[int, bytes] = (-1, b"")
        self._ticks = 0
        self._subscribers: set[asyncio.Queue[bytes | None]] = set()
        self._task: asyncio.Task[None] | None = None
        self.closed = False

    # ------------------------------------------------------------------ lifetime

    def start(self) -> None:
        """Start ticking on the running loop (the first sample is taken at once)."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ops-sampler")

    async def stop(self) -> None:
        """Stop ticking and end every live feed."""
        self._close_feeds()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _close_feeds(self) -> None:
        self.closed = True
        for queue in self._subscribers:
            _offer(queue, None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not self.dataplane.is_exiting():
            try:
                await self.sample()
            except Exception:  # a bad tick must not end the sampler
                logger.exception("ops sampler tick failed")
            # a late tick is not made up with a burst: samples stay >= interval/2 apart
            next_at = max(next_at + self.interval_s, loop.time() + self.interval_s / 2)
            await asyncio.sleep(next_at - loop.time())
        self._close_feeds()  # the frontend drains: live feeds must end for uvicorn to stop

    # ------------------------------------------------------------------ one tick

    async def sample(self) -> StatsDocument:
        """Take one sample, publish it and return it."""
        started = time.perf_counter()
        errors: list[str] = []
        reply = await self._stats_reply(errors)
        stats: Sequence[ModelStats] = reply.models if reply is not None else ()
        cpu_started = time.thread_time()  # the work below holds the loop: its cost
        now = time.time()
        processes = self.processes.sample(now)
        models = self.figures.update(now, stats, self.dataplane.snapshot)
        shared = self._shared_memory(processes)
        _fill_worker_restarts(processes, models)
        document = StatsDocument(
            schema_version=SCHEMA_VERSION, time=round(now, 3), interval_s=self.interval_s,
            sample_ms=0.0, sample_cpu_ms=0.0,
            server=ServerInfo(instance_id=self.instance_id, sampler_pid=os.getpid(),
                              sampler_started=round(self.started, 3),
                              ready=self.dataplane.is_ready(),
                              exiting=self.dataplane.is_exiting()),
            processes=processes, models=models, shared_memory=shared,
            llm=self.llm.update(now, stats),
            errors=errors, devices=_devices(reply.devices if reply is not None else ()))
        document.sample_cpu_ms = round((time.thread_time() - cpu_started) * 1e3, 2)
        document.sample_ms = round((time.perf_counter() - started) * 1e3, 2)
        self._publish(document)
        return document

    async def _stats_reply(self, errors: list[str]) -> StatsReply | None:
        try:
            reply = await asyncio.wait_for(self.dataplane.stats("", -1), STATS_TIMEOUT_S)
        except (ShoalError, TimeoutError) as exc:
            message = exc.message if isinstance(exc, ShoalError) else "no answer in time"
            errors.append(f"model statistics unavailable: {message}")
            return None
        if reply.error is not None:
            errors.append(f"model statistics unavailable: {reply.error.message}")
            return None
        return reply

    def _shared_memory(self, processes: list[ProcessStats]) -> SharedMemoryStats:
        frontends: dict[int, Owner] = {}
        workers: dict[str, Owner] = {}
        broker: Owner | None = None
        for row in processes:
            role = self.processes.roles.get(row.pid)
            if row.role == "frontend":
                frontends[row.pid] = Owner(row.key, row.pid)
            elif row.role == "broker":
                broker = Owner(row.key, row.pid)
            elif row.role == "worker" and role is not None:
                serial = worker_serial_prefix(role.arena_prefix, self.instance_id)
                if serial:
                    workers[serial] = Owner(row.key, row.pid)
        segments = scan_segments(self.instance_id, self.shm_directory)
        owners = attribute_segments(segments, self.instance_id, frontends, workers, broker)
        by_key: dict[str, int] = {}
        for owner in owners:
            by_key[owner.owner] = by_key.get(owner.owner, 0) + owner.bytes
        for row in processes:
            row.shm_bytes = by_key.get(row.key, 0)
        return SharedMemoryStats(
            total_bytes=sum(s.bytes for s in segments),
            total_resident_bytes=sum(s.resident_bytes for s in segments),
            owners=owners, client_regions=self._client_regions())

    def _client_regions(self) -> list[ClientRegionStats]:
        registry = self.dataplane.shared_memory
        regions = [ClientRegionStats(name=r.name, kind="system", key=r.key, offset=r.offset,
                                     byte_size=r.byte_size) for r in registry.status(None)]
        regions += [ClientRegionStats(name=r.name, kind="cuda", key="", offset=0,
                                      byte_size=r.byte_size, device_id=r.device_id)
                    for r in registry.cuda_status(None)]
        return sorted(regions, key=lambda r: r.name)

    # ------------------------------------------------------------------ publishing

    def _publish(self, document: StatsDocument) -> None:
        self.latest = document
        self.latest_json = _encoder.encode(document)
        self._ticks += 1
        self.history.append(_Point(
            document.time,
            {p.key: (p.label, p.cpu_percent, p.rss_bytes) for p in document.processes},
            {model_key(m): (f"{m.name} v{m.version}", m.requests_per_s,
                            m.latency.request_p99_us, m.queue_depth, m.in_flight)
             for m in document.models}))
        for queue in self._subscribers:
            _offer(queue, self.latest_json)

    def history_json(self, seconds: float | None = None) -> bytes:
        """The history as a ``HistoryDocument`` (the whole ring is encoded once per tick;
        ``seconds`` selects the last part of it)."""
        if seconds is None:
            if self._history_json[0] != self._ticks:
                self._history_json = (self._ticks, _encoder.encode(self._history(None)))
            return self._history_json[1]
        return _encoder.encode(self._history(seconds))

    def _history(self, seconds: float | None) -> HistoryDocument:
        points = list(self.history)
        if seconds is not None and points:
            points = [p for p in points if p.at >= points[-1].at - seconds]
        processes: dict[str, ProcessSeries] = {}
        models: dict[str, ModelSeries] = {}
        for index, point in enumerate(points):
            for key, (label, cpu, rss) in point.processes.items():
                series = processes.get(key)
                if series is None:
                    series = processes[key] = ProcessSeries(
                        label=label, cpu_percent=[None] * len(points),
                        rss_bytes=[None] * len(points))
                series.cpu_percent[index], series.rss_bytes[index] = cpu, rss
            for key, (label, rps, p99, queue, in_flight) in point.models.items():
                model = models.get(key)
                if model is None:
                    model = models[key] = ModelSeries(
                        label=label, requests_per_s=[None] * len(points),
                        request_p99_us=[None] * len(points),
                        queue_depth=[None] * len(points), in_flight=[None] * len(points))
                model.requests_per_s[index], model.request_p99_us[index] = rps, p99
                model.queue_depth[index], model.in_flight[index] = queue, in_flight
        return HistoryDocument(schema_version=SCHEMA_VERSION, interval_s=self.interval_s,
                               time=[p.at for p in points], processes=processes, models=models)

    def feed(self) -> AsyncGenerator[bytes, None]:
        """Every new document's JSON, starting with the latest; ends when the sampler stops.
        A reader that falls behind skips documents (it always gets the newest). Raises
        SubscriberLimit when MAX_SUBSCRIBERS feeds are open."""
        if len(self._subscribers) >= MAX_SUBSCRIBERS:
            raise SubscriberLimit(f"{MAX_SUBSCRIBERS} live feeds are open already")
        return self._feed()

    async def _feed(self) -> AsyncGenerator[bytes, None]:
        """Registered on its first step, so that a feed never started holds nothing."""
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=2)
        if self.latest_json:
            queue.put_nowait(self.latest_json)
        if self.closed:
            _offer(queue, None)
        self._subscribers.add(queue)
        try:
            while (item := await queue.get()) is not None:
                yield item
        finally:
            self._subscribers.discard(queue)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)


def model_key(model: ModelVersionStats) -> str:
    return f"{model.name}:{model.version}"


def _offer(queue: asyncio.Queue[bytes | None], item: bytes | None) -> None:
    """Put without waiting; a full queue drops its oldest entry (the end marker is kept)."""
    if queue.full():
        with contextlib.suppress(asyncio.QueueEmpty):
            dropped = queue.get_nowait()
            if dropped is None:
                item = None
    queue.put_nowait(item)


def _devices(devices: Sequence[DeviceMemory]) -> list[DeviceMemoryStats]:
    return [DeviceMemoryStats(
        device=d.device, capacity_bytes=d.capacity if d.capacity >= 0 else None,
        limit_bytes=d.limit if d.limit >= 0 else None, reserved_bytes=d.reserved,
        holders=[DeviceHolderStats(model=h.model, part=h.part, bytes=h.nbytes)
                 for h in d.holders]) for d in devices]


def _fill_worker_restarts(processes: list[ProcessStats], models: list[ModelVersionStats]
                          ) -> None:
    """A worker's restarts are its instance's, as the broker counts them."""
    restarts = {(m.name, m.version): m.instance_restarts for m in models}
    for row in processes:
        if row.role == "worker" and row.model is not None and row.version is not None:
            row.restarts = restarts.get((row.model, row.version), {}).get(row.instance or "", 0)

