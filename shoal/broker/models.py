"""The broker's model repository state: which models exist, their versions' runtimes, and the
read-only views pushed to frontends (DESIGN §1: the broker owns repository state)."""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
from collections.abc import Callable

from google.protobuf import json_format

from shoal.broker.ensemble import composing_model_names, ensemble_readiness, validate_ensemble
from shoal.broker.model_runtime import InstanceSlot, ModelVersionRuntime, build_runtime
from shoal.broker.repository import ModelSource, discover_models, load_model_source
from shoal.errors import ShoalError, invalid_arg
from shoal.messages import (
    ModelStats,
    ModelVersionState,
    RepositorySnapshot,
    WorkerSpec,
)
from shoal.model_config import config_from_json
from shoal.settings import Settings
from shoal.workers.devices import visible_gpu_count

logger = logging.getLogger(__name__)

_AUTOCOMPLETE_TIMEOUT_S = 60.0


def python_auto_complete(model_dir: str, config: object) -> object:
    """Run the model's ``auto_complete_config`` in a throw-away interpreter (as Triton runs it in a
    separate stub), returning the completed config."""
    model_file = getattr(config, "default_model_filename", "") or "model.py"
    versions = sorted((int(d) for d in os.listdir(model_dir) if d.isdigit() and d[0] != "0"),
                      reverse=True)
    candidates = [os.path.join(model_dir, str(v), model_file) for v in versions]
    model_py = next((c for c in candidates if os.path.isfile(c)), None)
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


class ModelManager:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sources: dict[str, ModelSource] = {}
        self.failed: dict[str, str] = {}
        self._runtimes: dict[tuple[str, int], ModelVersionRuntime] = {}
        self._serials = itertools.count()  # names each runtime's own shm (state segments)

    def load_repository(self) -> None:
        """Read every model's config (auto-completing python models) and build runtimes.
        Failures are recorded per model (``failed``) rather than raised."""
        try:
            found = discover_models(self.settings.model_repositories)
        except ShoalError as exc:
            self.failed["<repository>"] = exc.message
            return
        gpus = visible_gpu_count()
        for name, model_dir in sorted(found.items()):
            repository = os.path.dirname(model_dir)
            try:
                source = load_model_source(
                    name, model_dir, repository,
                    default_max_batch_size=self.settings.default_max_batch_size,
                    gpu_count=gpus, auto_complete=python_auto_complete,  # type: ignore[arg-type]
                    disable_auto_complete=self.settings.disable_auto_complete_config)
            except ShoalError as exc:
                logger.error("failed to load model '%s': %s", name, exc.message)
                self.failed[name] = exc.message
                continue
            except Exception as exc:
                logger.exception("failed to load model '%s'", name)
                self.failed[name] = f"{type(exc).__name__}: {exc}"
                continue
            try:
                runtimes = {v: build_runtime(source, v, self.settings, next(self._serials))
                            for v in source.versions}
            except ShoalError as exc:
                logger.error("failed to load model '%s': %s", name, exc.message)
                self.failed[name] = exc.message
                continue
            self.sources[name] = source
            for version, runtime in runtimes.items():
                self._runtimes[(name, version)] = runtime

    def plan_ensembles(self) -> None:
        """Validate every ensemble against its composing models (after all configs are read);
        an invalid one becomes a failed model, reason and all."""
        for (name, version), runtime in list(self._runtimes.items()):
            if runtime.config.platform != "ensemble":
                continue
            composing = {n: self.sources[n].config for n in composing_model_names(runtime.config)
                         if n in self.sources}
            loaded = {n: set(self.sources[n].versions) for n in composing}
            try:
                runtime.ensemble = validate_ensemble(runtime.config, composing,
                                                     loaded_versions=loaded)
            except ShoalError as exc:
                logger.error("failed to load ensemble '%s': %s", name, exc.message)
                self.failed[name] = exc.message
                del self._runtimes[(name, version)]
                self.sources.pop(name, None)

    def refresh_ensembles(self) -> None:
        ready: dict[str, set[int]] = {}
        for r in self._runtimes.values():
            if r.ensemble is None and r.state is ModelVersionState.READY:
                ready.setdefault(r.name, set()).add(r.version)
        for r in self._runtimes.values():
            if r.ensemble is not None:
                r.state, r.reason = ensemble_readiness(r.ensemble, ready)

    def runtimes(self) -> list[ModelVersionRuntime]:
        return list(self._runtimes.values())

    def runtime(self, name: str, version: int) -> ModelVersionRuntime | None:
        if version < 0:
            versions = sorted(v for (n, v) in self._runtimes if n == name)
            return self._runtimes[(name, versions[-1])] if versions else None
        return self._runtimes.get((name, version))

    def worker_spec(self, runtime: ModelVersionRuntime, slot: InstanceSlot, serial: int,
                    endpoint: str) -> WorkerSpec:
        source = runtime.source
        return WorkerSpec(
            identity=f"{runtime.name}:{runtime.version}:{slot.instance_name}:{serial}",
            model_name=runtime.name, model_version=runtime.version, model_dir=source.model_dir,
            version_dir=os.path.join(source.model_dir, str(runtime.version)),
            backend=runtime.backend, config_json=runtime.config_json_text,
            instance_name=slot.instance_name, kind=slot.kind, device_id=slot.device_id,
            broker_endpoint=endpoint, arena_prefix=f"{self.settings.segment_prefix}w{serial}-",
            settings_json=self.settings.to_json().decode())

    def load_failures(self) -> list[str]:
        messages = [f"{name}: {msg}" for name, msg in self.failed.items()]
        for runtime in self.runtimes():
            if any(s.gave_up and not s.ever_ready for s in runtime.instances):
                messages.append(f"{runtime.name} version {runtime.version}: {runtime.reason}")
        return messages

    def snapshot(self, exiting: bool) -> RepositorySnapshot:
        self.refresh_ensembles()
        infos = [r.info() for r in self.runtimes()]
        ready_models = {i.name for i in infos if i.state is ModelVersionState.READY}
        all_names = set(self.sources) | set(self.failed) - {"<repository>"}
        models_ready = (not exiting and all_names <= ready_models and "<repository>"
                        not in self.failed)
        failed = {n: m for n, m in self.failed.items() if n != "<repository>"}
        return RepositorySnapshot(models=infos, models_ready=models_ready, exiting=exiting,
                                  unloaded=sorted(failed), failed=failed)

    def stats(self, model: str, version: int,
              ensemble_pending: Callable[[ModelVersionRuntime], int] | None = None
              ) -> list[ModelStats]:
        """``pending``: requests queued and not executing; for an ensemble, its unanswered
        requests (``ensemble_pending``)."""
        def pending(r: ModelVersionRuntime) -> int:
            if r.ensemble is not None and ensemble_pending is not None:
                return ensemble_pending(r)
            return len(r.requests) - sum(len(k) for k in r.batches.values())

        return [r.stats.snapshot(pending(r)) for r in self.runtimes()
                if (not model or r.name == model) and (version < 0 or r.version == version)]
