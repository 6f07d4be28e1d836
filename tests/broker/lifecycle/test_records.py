"""The per-model lifecycle record: promote, fail, retire, drain (pure)."""

from __future__ import annotations

from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.broker.lifecycle.records import Generation, ModelRecord, Phase
from shoal.broker.model_runtime import build_runtime
from shoal.broker.repository import ModelSource
from shoal.messages import ModelVersionState
from shoal.settings import settings_from_flags


def _generation(gid: int, versions: list[int], started: float = 0.0) -> Generation:
    config = ModelConfig(name="m", backend="python", max_batch_size=0)
    config.instance_group.add(kind=ModelConfig().instance_group.add().KIND_CPU, count=1,
                              name="m")
    source = ModelSource("m", "/repo", "/repo/m", config, versions, "m/config.pbtxt")
    settings = settings_from_flags(model_repositories=["/repo"]).for_broker()
    runtimes = {v: build_runtime(source, v, settings, gid * 10 + v) for v in versions}
    return Generation(id=gid, name="m", source=source, runtimes=runtimes, started_at=started)


def test_promote_replaces_the_serving_generation_and_retires_dropped_versions() -> None:
    record = ModelRecord("m")
    first = _generation(1, [1, 2])
    record.loading = first
    assert record.promote(first, now=2.0) is None
    assert record.serving is first and first.phase is Phase.SERVING
    assert record.stats.loads == 1 and record.stats.last_load_seconds == 2.0
    second = _generation(2, [2, 3], started=5.0)
    record.loading = second
    old = record.promote(second, now=6.5)
    assert old is first and record.serving is second and record.loading is None
    assert record.retired == {1: "unloaded"}
    assert record.stats.last_load_seconds == 1.5


def test_a_failed_reload_keeps_the_serving_generation() -> None:
    record = ModelRecord("m")
    first = _generation(1, [1])
    record.promote(first, now=1.0)
    broken = _generation(2, [1])
    record.loading = broken
    record.fail(broken, "load failed for model 'm': boom")
    assert record.serving is first and record.loading is None
    assert broken.phase is Phase.FAILED and record.failure.endswith("boom")
    assert record.retired == {}  # nothing retired: version 1 still serves
    assert [r.version for r in record.visible()] == [1]


def test_a_failed_first_load_shows_its_versions_unavailable() -> None:
    record = ModelRecord("m")
    broken = _generation(1, [1, 2])
    record.loading = broken
    record.fail(broken, "why")
    record.start_draining(broken, deadline=10.0)
    assert broken.phase is Phase.FAILED  # stays failed while its workers stop
    assert record.visible() == [] and record.retired == {1: "why", 2: "why"}


def test_unload_drains_and_forgets() -> None:
    record = ModelRecord("m")
    generation = _generation(1, [1])
    record.promote(generation, now=0.0)
    record.retire(generation, "unloaded")
    record.start_draining(generation, deadline=30.0)
    runtime = generation.runtimes[1]
    assert record.serving is None and runtime.retiring and not runtime.serving()
    assert runtime.state is ModelVersionState.UNLOADING
    assert record.visible() == [runtime]  # shown UNLOADING until gone
    assert generation.workers_gone() and not generation.holds_requests()
    record.forget(generation)
    assert record.generations() == [] and record.retired == {1: "unloaded"}
    assert record.stats.unloads == 1
