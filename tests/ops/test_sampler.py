"""The sampler end to end within one process: a stub data plane answers the broker's part
(statistics, snapshot, client regions); processes and segments are real (this test process
as the tree's root, segment files in a temporary directory)."""

from __future__ import annotations

import asyncio
import functools
import pathlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, ParamSpec

import msgspec
import orjson
import psutil
import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.frontend.shm_registry import CudaRegionStatus, RegionStatus
from shoal.messages import (
    DeviceMemory,
    DeviceMemoryHolder,
    Duration,
    ModelStats,
    ModelVersionInfo,
    ModelVersionState,
    RepositorySnapshot,
    StatsReply,
)
from shoal.ops import sampler as sampler_module
from shoal.ops.sampler import Sampler, SubscriberLimit
from shoal.ops.schema import SCHEMA_VERSION, HistoryDocument, StatsDocument

ID = "00112233aabb"
P = ParamSpec("P")


def in_loop(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """Run an async test on a fresh event loop (the suite has no asyncio plugin)."""
    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


@dataclass
class Regions:
    def status(self, name: str | None) -> list[RegionStatus]:
        return [RegionStatus("input_data", "/client_in", 0, 4096)]

    def cuda_status(self, name: str | None) -> list[CudaRegionStatus]:
        return [CudaRegionStatus("gpu_out", 0, 1 << 20)]


@dataclass
class StubDataPlane:
    """The broker's answers: ``served`` requests of one model so far."""

    served: int = 0
    fail_stats: bool = False
    exiting: bool = False
    shared_memory: Regions = field(default_factory=Regions)

    @property
    def snapshot(self) -> RepositorySnapshot:
        config = orjson.dumps({"instance_group": [{"kind": "KIND_CPU", "count": 1}]})
        info = ModelVersionInfo("m", 1, ModelVersionState.READY, "", "python", 0, [], [],
                                False, config)
        return RepositorySnapshot([info], True)

    def is_ready(self) -> bool:
        return True

    def is_exiting(self) -> bool:
        return self.exiting

    async def stats(self, model: str, version: int) -> StatsReply:
        if self.fail_stats:
            raise ShoalError(ErrorCode.UNAVAILABLE, "statistics are not available")
        zero = Duration(0, 0)
        stats = ModelStats("m", 1, 0, self.served, self.served, Duration(self.served, 0), zero,
                           zero, zero, zero, zero, [], pending=3, in_flight=1)
        ledger = [DeviceMemory(0, 4 << 30, 2 << 30, 3000, [
            DeviceMemoryHolder("llm", "kv_pool", 2000),
            DeviceMemoryHolder("llm", "weights", 1000)])]
        return StatsReply(1, [stats], devices=ledger)


def make_sampler(tmp_path: pathlib.Path, dataplane: StubDataPlane) -> Sampler:
    (tmp_path / f"shoal-{ID}-fe{psutil.Process().pid}-0").write_bytes(b"x" * 8192)
    return Sampler(dataplane, ID, root=psutil.Process(), shm_directory=str(tmp_path))  # type: ignore[arg-type]


@in_loop
async def test_a_sample_is_a_complete_document(tmp_path: pathlib.Path) -> None:
    sampler = make_sampler(tmp_path, StubDataPlane(served=10))
    await sampler.sample()
    document = msgspec.json.decode(sampler.latest_json, type=StatsDocument)
    assert document.schema_version == SCHEMA_VERSION
    assert document.server.instance_id == ID and document.server.sampler_pid > 0
    me = next(p for p in document.processes if p.pid == psutil.Process().pid)
    assert me.role == "supervisor" and me.rss_bytes > 0
    model = document.models[0]
    assert (model.name, model.state, model.queue_depth, model.in_flight, model.instances) == (
        "m", "READY", 3, 1, 1)
    assert document.shared_memory.total_bytes == 8192
    assert [r.name for r in document.shared_memory.client_regions] == ["gpu_out", "input_data"]
    assert document.llm == [] and document.errors == []
    (gpu,) = document.devices  # the broker's device-memory ledger
    assert (gpu.device, gpu.capacity_bytes, gpu.limit_bytes, gpu.reserved_bytes) == (
        0, 4 << 30, 2 << 30, 3000)
    assert [(h.model, h.part, h.bytes) for h in gpu.holders] == [
        ("llm", "kv_pool", 2000), ("llm", "weights", 1000)]
    raw = orjson.loads(sampler.latest_json)  # the JSON names the README documents
    assert {"role", "pid", "cpu_percent", "rss_bytes"} <= raw["processes"][0].keys()
    assert {"name", "version", "state", "queue_depth", "in_flight"} <= raw["models"][0].keys()


@in_loop
async def test_rates_and_history_accumulate_over_ticks(tmp_path: pathlib.Path) -> None:
    dataplane = StubDataPlane(served=0)
    sampler = make_sampler(tmp_path, dataplane)
    for served in (0, 50, 150):
        dataplane.served = served
        await sampler.sample()
        await asyncio.sleep(0.05)
    assert sampler.latest is not None and sampler.latest.models[0].requests_per_s > 0
    history = msgspec.json.decode(sampler.history_json(), type=HistoryDocument)
    assert len(history.time) == 3
    series = history.models["m:1"]
    assert series.requests_per_s[0] == 0.0 and series.requests_per_s[2] is not None
    assert series.requests_per_s[2] > 0 and series.queue_depth == [3, 3, 3]
    assert all(len(s.cpu_percent) == 3 for s in history.processes.values())
    assert sampler.history_json() is sampler.history_json()  # encoded once per tick
    last = msgspec.json.decode(sampler.history_json(seconds=0.001), type=HistoryDocument)
    assert len(last.time) == 1


@in_loop
async def test_history_is_bounded(tmp_path: pathlib.Path) -> None:
    sampler = Sampler(StubDataPlane(), ID, root=psutil.Process(),  # type: ignore[arg-type]
                      shm_directory=str(tmp_path), interval_s=1.0, history_s=3.0)
    for _ in range(5):
        await sampler.sample()
    assert len(sampler.history) == 3


@in_loop
async def test_missing_statistics_are_reported_not_fatal(tmp_path: pathlib.Path) -> None:
    sampler = make_sampler(tmp_path, StubDataPlane(fail_stats=True))
    document = await sampler.sample()
    assert document.errors == ["model statistics unavailable: statistics are not available"]
    assert document.processes and document.models[0].state == "READY"


@in_loop
async def test_feed_gets_each_document_and_ends_when_the_sampler_stops(
        tmp_path: pathlib.Path) -> None:
    dataplane = StubDataPlane()
    sampler = make_sampler(tmp_path, dataplane)
    sampler.interval_s = 0.05
    sampler.start()
    received: list[bytes] = []

    async def read() -> None:
        async for document in sampler.feed():
            received.append(document)

    reader = asyncio.create_task(read())
    while len(received) < 3:
        await asyncio.sleep(0.02)
    assert sampler.subscribers == 1
    await sampler.stop()
    await asyncio.wait_for(reader, 2)
    times = [orjson.loads(d)["time"] for d in received]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert sampler.subscribers == 0


@in_loop
async def test_the_sampler_ends_its_feeds_when_the_frontend_exits(
        tmp_path: pathlib.Path) -> None:
    dataplane = StubDataPlane()
    sampler = make_sampler(tmp_path, dataplane)
    sampler.interval_s = 0.05
    sampler.start()
    feed = sampler.feed()
    assert await anext(feed)
    dataplane.exiting = True
    async for _ in feed:  # ends by itself
        pass
    assert sampler.closed
    await sampler.stop()


@in_loop
async def test_too_many_feeds_are_refused(tmp_path: pathlib.Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_module, "MAX_SUBSCRIBERS", 1)
    sampler = make_sampler(tmp_path, StubDataPlane())
    await sampler.sample()
    first = sampler.feed()
    assert await anext(first)
    with pytest.raises(SubscriberLimit):
        sampler.feed()
    await first.aclose()
    assert sampler.subscribers == 0
