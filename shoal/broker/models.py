"""The broker's model repository state: every model's lifecycle record, the generations' runtimes,
reading a model's source for a load, and the read-only views pushed to frontends
(docs/architecture.md §1: the broker owns repository state).

Threads: ``read_source`` runs on the lifecycle driver's load threads (filesystem work and the
auto-complete subprocess only; it touches no broker state); everything else runs on the broker
loop.
"""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.broker.ensemble import ensemble_readiness
from shoal.broker.lifecycle.materialize import materialize
from shoal.broker.lifecycle.records import Generation, LoadCommand, ModelRecord
from shoal.broker.llm_stats import sum_llm_stats
from shoal.broker.model_runtime import InstanceSlot, ModelVersionRuntime, build_runtime
from shoal.broker.pool import WorkerState
from shoal.broker.repository import (
    ModelSource,
    SourceError,
    discover_models,
    load_model_source,
)
from shoal.broker.thread_policy import intra_op_share, read_cpu_budget
from shoal.config.load_overrides import (
    check_load_parameters,
    check_model_directory,
    parse_config_override,
)
from shoal.config.model_config import backend_name, config_from_json
from shoal.errors import ShoalError, invalid_arg
from shoal.messages import (
    LlmStats,
    ModelLoadStats,
    ModelStats,
    ModelVersionInfo,
    ModelVersionState,
    RepositorySnapshot,
    WorkerSpec,
)
from shoal.process.devices import visible_gpu_count
from shoal.settings import BrokerSettings
from shoal.workers.backends.catalog import builtin_backend
from shoal.workers.backends.python_based import python_based_backend_file

logger = logging.getLogger(__name__)

_AUTOCOMPLETE_TIMEOUT_S = 60.0


def _applies_thread_policy(backend: str) -> bool:
    """The backend applies the thread policy's count (WorkerSpec.intra_op_threads; its catalog
    entry says). Others get the field too but keep their own defaults."""
    entry = builtin_backend(backend)
    return entry is not None and entry.thread_policy


def python_auto_complete(model_dir: str, config: object, backend_file: str | None = None
                         ) -> object:
    """Run the model's ``auto_complete_config`` in a throw-away interpreter (as Triton runs it in a
    separate stub), returning the completed config. ``backend_file``: a python-based backend's
    model.py, which completes the configs of its models (else the model's own file)."""
    model_file = getattr(config, "default_model_filename", "") or "model.py"
    versions = sorted((int(d) for d in os.listdir(model_dir) if d.isdigit() and d[0] != "0"),
                      reverse=True)
    candidates = [os.path.join(model_dir, str(v), model_file) for v in versions]
    model_py = backend_file or next((c for c in candidates if os.path.isfile(c)), None)
    if model_py is None:
        return config
    with open(model_py, encoding="utf-8", errors="replace") as f:
        if "auto_complete_config" not in f.read():
            return config  # nothing to run: skip the throw-away interpreter
    partial = json_format.MessageToJson(config, preserving_proto_field_name=True)  # type: ignore[arg-type]
    proc = subprocess.run(
        [sys.executable, "-m", "shoal.workers.autocomplete", model_py],
        input=partial.encode(), capture_output=True, timeout=_AUTOCOMPLETE_TIMEOUT_S, check=False,
    )
    if proc.returncode != 0:
        detail = proc.stderr.decode(errors="replace").strip().splitlines()
        raise invalid_arg(f"{os.path.basename(model_dir)}: auto_complete_config failed: "
                          f"{detail[-1] if detail else 'exit code ' + str(proc.returncode)}")
    return config_from_json(proc.stdout)


@dataclass(frozen=True)
class SourceRead:
    """What a load thread found: the model's source, or why it cannot load (``not_found``: no
    such model in the repository, Triton's INTERNAL "failed to poll"; ``versions``: those the
    failed load would have loaded, shown UNAVAILABLE with the reason, ``SourceError``).
    ``materialized_dir`` is the private directory its file overrides were written to ("" =
    none)."""

    source: ModelSource | None
    error: str = ""
    materialized_dir: str = ""
    not_found: bool = False
    versions: tuple[int, ...] = ()


def model_temp_root(settings: BrokerSettings) -> str:
    return settings.model_control.temp_root or os.path.join(settings.instance.runtime_dir, "models")


class ModelManager:
    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.records: dict[str, ModelRecord] = {}
        self.repository_models: dict[str, str] = {}  # name -> model dir, from the last scan
        self.repository_failure = ""
        self._serials = itertools.count()  # names each runtime's own shm (state segments)
        self._generation_ids = itertools.count(1)
        self.gpu_count = visible_gpu_count()
        self.cpu_budget = read_cpu_budget()  # the cores the server may use (thread_policy.py)

    def auto_complete(self, model_dir: str, config: ModelConfig) -> ModelConfig:
        """The backend's auto-complete: from the model file for a built-in whose catalog entry
        has one (onnxruntime and tensorflow parse the file in the broker, openvino and fil read
        it in a throw-away interpreter), else the python backend's ``auto_complete_config`` (a
        no-op for a model without one)."""
        backend = backend_name(config)
        entry = builtin_backend(backend)
        from_model_file = entry.file_auto_complete if entry is not None else None
        if from_model_file is not None:
            default_max_batch = int(self.settings.backend.setting(
                backend, "default-max-batch-size", "4"))
            return from_model_file(model_dir, config, default_max_batch)
        backend_file = (python_based_backend_file(backend, self.settings.backend.directory)
                        if entry is None else None)
        completed: ModelConfig = python_auto_complete(  # type: ignore[assignment]
            model_dir, config, backend_file)
        return completed

    # ------------------------------------------------------------------ repository

    def discover(self) -> None:
        """Rescan the repositories' model names (loop thread; directory listings only)."""
        try:
            self.repository_models = discover_models(self.settings.model_control.repositories)
            self.repository_failure = ""
        except ShoalError as exc:
            self.repository_failure = exc.message

    def record(self, name: str) -> ModelRecord:
        record = self.records.get(name)
        if record is None:
            record = self.records[name] = ModelRecord(name)
        return record

    def forget_if_unknown(self, name: str) -> None:
        """Drop the record of ``name`` when it is not a model: not in the repository, and
        nothing of it left (no command, no generation, no version shown, not wanted, not
        needed by another model's load). What a load of a missing name or an unload of an
        unknown one leaves behind: Triton keeps no trace of such names (repository index,
        metrics), and a record per name tried would grow without bound."""
        record = self.records.get(name)
        if (record is None or name in self.repository_models or record.busy or record.commands
                or record.generations() or record.retired or record.wanted):
            return
        for other in self.records.values():
            if name in other.loaded_with or (
                    other.loading is not None and name in other.loading.dependencies):
                return
        del self.records[name]

    def read_source(self, name: str, command: LoadCommand, model_dir: str | None) -> SourceRead:
        """Load thread: check the request, write its overrides (if any) to a private directory,
        read and complete the config. Never raises."""
        materialized = ""
        try:
            config_override = None
            if command.config_json or command.files:
                overrides = check_load_parameters(
                    name, {"config": command.config_json, **command.files})
                config_override = parse_config_override(name, overrides.config_json)
                if overrides.files:
                    root = model_temp_root(self.settings)
                    materialized = model_dir = materialize(name, overrides, root)
            if model_dir is None:
                return SourceRead(None, f"failed to load '{name}', failed to poll from model "
                                  "repository", not_found=True)
            if not materialized:
                model_dir = check_model_directory(os.path.dirname(model_dir), name)
            source = load_model_source(
                name, model_dir, os.path.dirname(model_dir),
                default_max_batch_size=self.settings.backend.default_max_batch_size,
                gpu_count=self.gpu_count, auto_complete=self.auto_complete,
                disable_auto_complete=self.settings.model_control.disable_auto_complete_config,
                config_name=self.settings.model_control.config_name,
                config_override=config_override)
            return SourceRead(source, materialized_dir=materialized)
        except SourceError as exc:
            return SourceRead(None, exc.message, materialized, versions=tuple(exc.versions))
        except ShoalError as exc:
            return SourceRead(None, exc.message, materialized)
        except Exception as exc:
            logger.exception("failed to read model '%s'", name)
            return SourceRead(None, f"{type(exc).__name__}: {exc}", materialized)

    def build_generation(self, name: str, read: SourceRead, command: LoadCommand,
                         now: float) -> Generation:
        """Loop thread: one runtime per selected version (raises ShoalError)."""
        assert read.source is not None
        source = read.source
        runtimes = {v: build_runtime(source, v, self.settings, next(self._serials))
                    for v in source.versions}
        return Generation(id=next(self._generation_ids), name=name, source=source,
                          runtimes=runtimes, started_at=now, waiter=command.waiter,
                          materialized_dir=read.materialized_dir)

    # ------------------------------------------------------------------ lookups

    def generations(self) -> list[Generation]:
        return [g for r in self.records.values() for g in r.generations()]

    def runtimes(self) -> list[ModelVersionRuntime]:
        """Every runtime that holds workers or requests: serving, loading and draining."""
        return [rt for g in self.generations() for rt in g.runtimes.values()]

    def runtime(self, name: str, version: int) -> ModelVersionRuntime | None:
        """The serving runtime of ``name`` (version -1: the highest)."""
        record = self.records.get(name)
        if record is None or record.serving is None:
            return None
        runtimes = record.serving.runtimes
        if version < 0:
            return runtimes[max(runtimes)] if runtimes else None
        return runtimes.get(version)

    def runs_on_cpu(self, slot: InstanceSlot) -> bool:
        return slot.kind == "CPU" or (slot.kind == "MODEL" and self.gpu_count == 0)

    def cpu_instance_count(self) -> int:
        """CPU instances of every runtime held (loading, serving, draining), plus one for each
        model whose load is still reading its config (at start the models load side by side:
        the first to spawn would otherwise take every core); a reload's old and new generation
        name the same instances, so each (model, version, instance) counts once."""
        held = len({(rt.name, rt.version, slot.instance_name) for rt in self.runtimes()
                    for slot in rt.instances if self.runs_on_cpu(slot)})
        reading = sum(1 for r in self.records.values()
                      if (r.busy or r.commands) and not r.generations())
        return held + reading

    def intra_op_threads(self, runtime: ModelVersionRuntime, slot: InstanceSlot) -> int:
        """The thread policy's count for a worker of ``slot`` (0: not a CPU instance); logged
        once per model version, when its first instance first starts."""
        if not self.runs_on_cpu(slot):
            return 0
        share = intra_op_share(self.cpu_budget, self.settings.http_workers,
                               self.cpu_instance_count())
        if (slot is runtime.instances[0] and slot.restarts == 0
                and _applies_thread_policy(runtime.backend)):
            logger.info("model '%s' version %d: default %d intra-op thread(s) per CPU instance "
                        "unless its config names a count (%s)", runtime.name, runtime.version,
                        share.threads, share.reason)
        return share.threads

    def worker_spec(self, runtime: ModelVersionRuntime, slot: InstanceSlot, serial: int,
                    endpoint: str) -> WorkerSpec:
        source = runtime.source
        return WorkerSpec(
            identity=f"{runtime.name}:{runtime.version}:{slot.instance_name}:{serial}",
            model_name=runtime.name, model_version=runtime.version, model_dir=source.model_dir,
            version_dir=os.path.join(source.model_dir, str(runtime.version)),
            backend=runtime.backend, config_json=runtime.config_json_text,
            instance_name=slot.instance_name, kind=slot.kind, device_id=slot.device_id,
            broker_endpoint=endpoint,
            arena_prefix=f"{self.settings.instance.segment_prefix}w{serial}-",
            settings=self.settings.for_workers(),
            intra_op_threads=self.intra_op_threads(runtime, slot))

    def load_failures(self) -> list[str]:
        messages = [f"<repository>: {self.repository_failure}"] if self.repository_failure else []
        return messages + [f"{r.name}: {r.failure}" for r in self.records.values()
                           if r.failure and r.serving is None]

    # ------------------------------------------------------------------ views

    def refresh_ensembles(self) -> None:
        ready: dict[str, set[int]] = {}
        for record in self.records.values():
            if record.serving is None or record.serving.is_ensemble:
                continue
            for r in record.serving.runtimes.values():
                if r.state is ModelVersionState.READY:
                    ready.setdefault(r.name, set()).add(r.version)
        for record in self.records.values():
            if record.serving is not None and record.serving.is_ensemble:
                for r in record.serving.runtimes.values():
                    if r.ensemble is not None:
                        r.state, r.reason = ensemble_readiness(r.ensemble, ready)

    def _infos(self, record: ModelRecord) -> list[ModelVersionInfo]:
        infos = [r.info() for r in record.visible()]
        if record.serving is not None and record.failure:
            infos = [msgspec.structs.replace(i, reason=i.reason or record.failure)
                     for i in infos]
        shown = {i.version for i in infos}
        for version, reason in sorted(record.retired.items()):
            if version not in shown:
                infos.append(ModelVersionInfo(
                    name=record.name, version=version, state=ModelVersionState.UNAVAILABLE,
                    reason=reason, platform="", max_batch_size=0, inputs=[], outputs=[],
                    decoupled=False, config_json=b"{}", serving=False))
        return infos

    def snapshot(self, exiting: bool) -> RepositorySnapshot:
        """The models, as Triton's repository index lists them: every model of the repository
        (one that never got a version, e.g. its config does not parse, by name only, in
        ``unloaded``) and any other name that has versions to show (loaded from load
        overrides); never a name that was only tried (a load of a missing model, an unload of
        an unknown one). Load statistics (``shoal_model_*`` metrics) for those names only."""
        self.refresh_ensembles()
        infos: list[ModelVersionInfo] = []
        unloaded: list[str] = []
        listed: list[str] = []
        for name in sorted(set(self.repository_models) | set(self.records)):
            record = self.records.get(name)
            found = self._infos(record) if record is not None else []
            if not found and name not in self.repository_models:
                continue
            listed.append(name)
            infos += found
            if not found:
                unloaded.append(name)
        ready_models = {i.name for i in infos if i.state is ModelVersionState.READY}
        wanted = {r.name for r in self.records.values() if r.wanted}
        models_ready = not exiting and wanted <= ready_models and not self.repository_failure
        load_stats = [ModelLoadStats(r.name, r.stats.loads, r.stats.failures, r.stats.unloads,
                                     r.stats.last_load_seconds)
                      for name in listed if (r := self.records.get(name)) is not None]
        return RepositorySnapshot(models=infos, models_ready=models_ready, exiting=exiting,
                                  unloaded=unloaded, load_stats=load_stats)

    def stats(self, model: str, version: int,
              ensemble_pending: Callable[[ModelVersionRuntime], int] | None = None
              ) -> list[ModelStats]:
        """``pending``: requests queued and not executing; for an ensemble, its unanswered
        requests (``ensemble_pending``)."""
        def pending(r: ModelVersionRuntime) -> int:
            if r.ensemble is not None and ensemble_pending is not None:
                return ensemble_pending(r)
            return len(r.requests) - sum(len(k) for k in r.batches.values())

        def in_flight(r: ModelVersionRuntime) -> int:
            return sum(len(k) for k in r.batches.values()) + sum(
                len(s.worker.streams) for s in r.instances if s.worker is not None)

        def llm(r: ModelVersionRuntime) -> LlmStats | None:
            return sum_llm_stats(
                s.worker.llm for s in r.instances if s.worker is not None
                and s.worker.state not in (WorkerState.STOPPING, WorkerState.DEAD))

        shown = [r for record in self.records.values() for r in record.visible()]
        return [msgspec.structs.replace(
                    r.stats.snapshot(pending(r), in_flight(r),
                                     {s.instance_name: s.restarts for s in r.instances}),
                    llm=llm(r))
                for r in shown
                if (not model or r.name == model) and (version < 0 or r.version == version)]
