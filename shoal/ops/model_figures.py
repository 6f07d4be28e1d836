"""Per model version figures from successive broker statistics and the pushed snapshot.

The broker's counters and histograms are cumulative since a version was loaded. Rates are the
difference between this reading and the previous one over the time between them; percentiles
and the recent batch-size distribution use the difference between this reading and the oldest
one kept in the window (about ``window_s``). A counter that went down means the version was
loaded again: its window starts afresh.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from shoal.messages import ModelLoadStats, ModelStats, ModelVersionInfo, RepositorySnapshot
from shoal.ops.percentiles import histogram_delta, percentile_us
from shoal.ops.schema import BatchSizeCount, LatencySummary, ModelVersionStats

LATENCY_WINDOW_S = 10.0


class _InstanceGroup(msgspec.Struct):
    count: int = 1
    kind: str = "KIND_CPU"
    gpus: list[int] = []


class _InstanceConfig(msgspec.Struct):
    platform: str = ""
    instance_group: list[_InstanceGroup] = []


def configured_instances(config_json: bytes) -> int:
    """Model instances of a completed config (Triton's /config JSON): per group ``count``, on
    each listed GPU for KIND_GPU. 0 for an ensemble (it runs no instance)."""
    try:
        config = msgspec.json.decode(config_json, type=_InstanceConfig)
    except msgspec.DecodeError:
        return 0
    if config.platform == "ensemble":
        return 0
    return sum(g.count * (len(g.gpus) if g.kind == "KIND_GPU" and g.gpus else 1)
               for g in config.instance_group)


@dataclass(frozen=True)
class _Reading:
    at: float
    ended: int  # success + fail
    inferences: int
    failures: int
    request: list[int]
    queue: list[int]
    compute: list[int]
    executions: dict[int, int]  # batch size -> executions


def _reading(at: float, stats: ModelStats) -> _Reading:
    return _Reading(at, stats.success.count + stats.fail.count, stats.inference_count,
                    stats.fail.count, list(stats.request_latency.counts),
                    list(stats.queue_latency.counts), list(stats.compute_latency.counts),
                    {b.batch_size: b.compute_infer.count for b in stats.batch_stats})


@dataclass
class _Track:
    readings: deque[_Reading] = field(default_factory=deque)


def _rate(newer: int, older: int, seconds: float) -> float:
    return round((newer - older) / seconds, 2) if seconds > 0 and newer >= older else 0.0


class ModelFigures:
    """Keeps the readings of the last ``window_s`` per version. Single-threaded."""

    def __init__(self, window_s: float = LATENCY_WINDOW_S) -> None:
        self.window_s = window_s
        self._tracks: dict[tuple[str, int], _Track] = {}
        self._instances: dict[tuple[str, int], tuple[bytes, int]] = {}

    def _instance_count(self, info: ModelVersionInfo) -> int:
        key = (info.name, info.version)
        cached = self._instances.get(key)
        if cached is None or cached[0] != info.config_json:
            cached = (info.config_json, configured_instances(info.config_json))
            self._instances[key] = cached
        return cached[1]

    def update(self, at: float, stats: Sequence[ModelStats],
               snapshot: RepositorySnapshot) -> list[ModelVersionStats]:
        """The figures of every version in ``snapshot`` or ``stats`` at time ``at`` (seconds,
        monotonic or wall: only differences are used)."""
        infos = {(i.name, i.version): i for i in snapshot.models}
        by_version = {(s.name, s.version): s for s in stats}
        loads = {s.name: s for s in snapshot.load_stats}
        rows: list[ModelVersionStats] = []
        for key in sorted(infos.keys() | by_version.keys()):
            info, current = infos.get(key), by_version.get(key)
            rows.append(self._row(at, key, info, current, loads.get(key[0])))
        for gone in self._tracks.keys() - by_version.keys():
            del self._tracks[gone]
        for gone in self._instances.keys() - infos.keys():
            del self._instances[gone]
        return rows

    def _row(self, at: float, key: tuple[str, int], info: ModelVersionInfo | None,
             stats: ModelStats | None, load: ModelLoadStats | None) -> ModelVersionStats:
        row = ModelVersionStats(
            name=key[0], version=key[1], state=info.state.value if info else "UNKNOWN",
            reason=info.reason if info else "", platform=info.platform if info else "",
            instances=self._instance_count(info) if info else 0, queue_depth=0, in_flight=0,
            requests_per_s=0.0, inferences_per_s=0.0, errors_per_s=0.0, success_count=0,
            fail_count=0, rejections=0, fail_by_reason={}, batch_sizes=[],
            latency=LatencySummary(window_s=0.0, count=0), instance_restarts={})
        if load is not None:
            row.loads, row.load_failures = load.loads, load.failures
            row.last_load_seconds = round(load.last_load_seconds, 3)
        if stats is None:
            return row
        row.queue_depth, row.in_flight = stats.pending, stats.in_flight
        row.success_count, row.fail_count = stats.success.count, stats.fail.count
        row.fail_by_reason = dict(stats.fail_by_reason)
        row.rejections = stats.fail_by_reason.get("REJECTED", 0)
        row.instance_restarts = dict(stats.instance_restarts)
        now = _reading(at, stats)
        track = self._tracks.setdefault(key, _Track())
        if track.readings and (now.ended < track.readings[-1].ended
                               or now.inferences < track.readings[-1].inferences):
            track.readings.clear()  # loaded again: counters started from zero
        previous = track.readings[-1] if track.readings else None
        track.readings.append(now)
        while len(track.readings) > 2 and track.readings[1].at <= at - self.window_s:
            track.readings.popleft()
        if previous is not None:
            seconds = at - previous.at
            row.requests_per_s = _rate(now.ended, previous.ended, seconds)
            row.inferences_per_s = _rate(now.inferences, previous.inferences, seconds)
            row.errors_per_s = _rate(now.failures, previous.failures, seconds)
        oldest = track.readings[0]
        row.latency = self._latency(now, oldest if oldest is not now else None)
        row.batch_sizes = [
            BatchSizeCount(batch_size=size, executions=count,
                           recent=count - (oldest.executions.get(size, 0)
                                           if oldest is not now else 0))
            for size, count in sorted(now.executions.items())]
        return row

    def _latency(self, now: _Reading, oldest: _Reading | None) -> LatencySummary:
        """Percentiles of what ended after ``oldest`` (since load when there is none yet)."""
        def delta(attr: str) -> list[int]:
            newer: list[int] = getattr(now, attr)
            return histogram_delta(newer, getattr(oldest, attr) if oldest else [])

        request, queue, compute = delta("request"), delta("queue"), delta("compute")
        window = round(now.at - oldest.at, 1) if oldest else 0.0
        return LatencySummary(
            window_s=window, count=sum(request),
            request_p50_us=_rounded(percentile_us(request, 0.5)),
            request_p99_us=_rounded(percentile_us(request, 0.99)),
            queue_p50_us=_rounded(percentile_us(queue, 0.5)),
            queue_p99_us=_rounded(percentile_us(queue, 0.99)),
            compute_p50_us=_rounded(percentile_us(compute, 0.5)),
            compute_p99_us=_rounded(percentile_us(compute, 0.99)))


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
