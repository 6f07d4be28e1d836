"""Per-model lifecycle bookkeeping (docs/architecture.md §6): which generation of a model serves,
which one is loading, which ones drain, and the control commands waiting their turn.

A *generation* is one load of a model: one ModelSource (config + files) and a runtime per
selected version, with its own workers. A reload starts a new generation while the serving one
keeps serving; traffic moves when the new one is ready; the old one drains its queued and running
requests and then stops. Commands on one model run one at a time, in arrival order (Triton
serialises loads of one model the same way); commands on different models run in parallel.

Pure: no sockets, no processes, no clock of its own (times are passed in). The broker's
``LifecycleDriver`` performs what these records decide (spawn, stop, answer).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from shoal.broker.model_runtime import ModelVersionRuntime
from shoal.broker.repository import ModelSource
from shoal.messages import ModelVersionState


class Phase(enum.Enum):
    LOADING = "loading"    # workers starting (or, for an ensemble, composing models loading)
    SERVING = "serving"    # takes new requests
    DRAINING = "draining"  # no new requests; finishes what it holds, then its workers stop
    FAILED = "failed"      # its load failed; its workers are being stopped


@dataclass(frozen=True)
class Waiter:
    """Who asked for a command: a frontend (or BLS worker) identity and its query id."""

    identity: bytes
    query_id: int


@dataclass(frozen=True)
class LoadCommand:
    """Load or reload. ``config_json`` / ``files``: Triton's load overrides (checked by
    ``shoal.config.load_overrides`` before they get here). ``origin``: "start", "api", "poll" or
    "dependency" (an ensemble's composing model)."""

    waiter: Waiter | None
    origin: str
    config_json: str = ""
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class UnloadCommand:
    waiter: Waiter | None
    origin: str
    unload_dependents: bool = False


Command = LoadCommand | UnloadCommand


@dataclass(eq=False)
class Generation:
    """One load of one model. ``ledger_owner`` names its device-memory reservation;
    ``materialized_dir`` is the private directory of its load overrides ("" = none)."""

    id: int
    name: str
    source: ModelSource
    runtimes: dict[int, ModelVersionRuntime]
    started_at: float
    waiter: Waiter | None = None
    phase: Phase = Phase.LOADING
    dependencies: tuple[str, ...] = ()  # an ensemble's composing models
    materialized_dir: str = ""
    ledger_owner: str = ""
    drain_deadline: float | None = None

    @property
    def is_ensemble(self) -> bool:
        return bool(self.source.config.platform == "ensemble")

    def failed_reason(self) -> str | None:
        """Why this loading generation cannot become ready (an instance gave up before it was
        ever ready), or None while it still may."""
        for runtime in self.runtimes.values():
            for slot in runtime.instances:
                if slot.gave_up and not slot.ever_ready:
                    return (f"version {runtime.version}: {runtime.reason or slot.last_exit}")
        return None

    def all_ready(self) -> bool:
        return all(r.all_ready() for r in self.runtimes.values())

    def holds_requests(self) -> bool:
        return any(r.requests for r in self.runtimes.values())

    def workers_gone(self) -> bool:
        return all(s.worker is None for r in self.runtimes.values() for s in r.instances)


@dataclass
class LoadStats:
    """Load/unload events of one model (metrics)."""

    loads: int = 0
    failures: int = 0
    unloads: int = 0
    last_load_seconds: float = 0.0


@dataclass
class ModelRecord:
    """Everything the broker knows about one model name.

    ``busy``: a command is in progress (a load reading its source or starting its workers);
    later commands wait in ``commands``. ``retired``: versions shown UNAVAILABLE (with this
    reason) when no generation serves them. ``failure``: why the last load failed ("" after a
    success). ``wanted``: counted by strict readiness. ``loaded_with``: models loaded because this
    one (an ensemble) needed them (``unload_dependents``)."""

    name: str
    serving: Generation | None = None
    loading: Generation | None = None
    draining: list[Generation] = field(default_factory=list)
    commands: deque[Command] = field(default_factory=deque)
    busy: bool = False
    retired: dict[int, str] = field(default_factory=dict)
    failure: str = ""
    wanted: bool = False
    loaded_with: set[str] = field(default_factory=set)
    stats: LoadStats = field(default_factory=LoadStats)

    def generations(self) -> list[Generation]:
        found = [g for g in (self.serving, self.loading) if g is not None]
        return found + self.draining

    def visible(self) -> list[ModelVersionRuntime]:
        """The runtimes the repository index and metadata show: the serving generation's, else
        the loading one's, else the draining ones' (UNLOADING until they are gone)."""
        for generation in (self.serving, self.loading):
            if generation is not None:
                return list(generation.runtimes.values())
        return [r for g in self.draining if g.phase is Phase.DRAINING
                for r in g.runtimes.values()]

    def promote(self, generation: Generation, now: float) -> Generation | None:
        """The loading generation is ready: it serves; returns the one it replaces (to drain).
        Versions the new one dropped are shown as unloaded."""
        old = self.serving
        self.serving, self.loading = generation, None
        generation.phase = Phase.SERVING
        self.failure = ""
        self.retired = {}
        if old is not None:
            self.retired = {v: "unloaded" for v in old.runtimes if v not in generation.runtimes}
        self.stats.loads += 1
        self.stats.last_load_seconds = max(0.0, now - generation.started_at)
        return old

    def fail(self, generation: Generation, reason: str) -> None:
        """The loading generation failed: the serving one (if any) stays untouched."""
        if self.loading is generation:
            self.loading = None
        generation.phase = Phase.FAILED
        self.failure = reason
        self.stats.failures += 1
        if self.serving is None:
            self.retired = {v: reason for v in generation.runtimes}

    def retire(self, generation: Generation, reason: str) -> None:
        """Take the serving generation out of service (unload)."""
        if self.serving is generation:
            self.serving = None
        self.retired = {v: reason for v in generation.runtimes}
        self.stats.unloads += 1

    def start_draining(self, generation: Generation, deadline: float) -> None:
        """Stop taking requests; a FAILED generation keeps its phase (it is never shown)."""
        if generation.phase is not Phase.FAILED:
            generation.phase = Phase.DRAINING
        generation.drain_deadline = deadline
        for runtime in generation.runtimes.values():
            runtime.retiring = True
            runtime.state = ModelVersionState.UNLOADING
            runtime.reason = ""
        self.draining.append(generation)

    def forget(self, generation: Generation) -> None:
        """Its workers are gone: drop it."""
        if generation in self.draining:
            self.draining.remove(generation)
        if self.loading is generation:
            self.loading = None
