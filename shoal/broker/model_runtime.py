"""One loaded model version inside the broker: its scheduling, its instances (worker slots), its
queued and executing requests, and its statistics.

Ownership: a request belongs to exactly one ModelVersionRuntime from submit until its terminal
answer; ``requests`` holds it while queued or executing, ``batches`` maps an in-flight batch to
its request keys.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from shoal.broker.ensemble import EnsemblePlan
from shoal.broker.pool import WorkerHandle, WorkerState
from shoal.broker.rate_limiter.config import InstanceNeeds, instance_needs
from shoal.broker.repository import ModelSource
from shoal.broker.schedulers.base import QueuedRequest, RequestKey, Scheduler
from shoal.broker.schedulers.default import DefaultScheduler
from shoal.broker.schedulers.dynamic import DynamicBatcher, DynamicBatcherConfig
from shoal.broker.schedulers.iterative import IterativeScheduler
from shoal.broker.schedulers.ordering import ResponseOrderer
from shoal.broker.schedulers.scheduling import (
    IterativeScheduling,
    QueueScheduling,
    RuntimeScheduling,
)
from shoal.broker.schedulers.sequence.scheduling import SequenceScheduling
from shoal.broker.state_store import store_factory
from shoal.broker.stats import ModelVersionStats
from shoal.broker.trace_stamps import COMPUTE_START, queued_stamps
from shoal.config.model_config import (
    backend_name,
    config_to_json,
    instance_names,
    is_decoupled,
    platform_name,
    tensor_specs,
)
from shoal.errors import ShoalError, invalid_arg, unsupported
from shoal.messages import (
    BatchTimings,
    InferRequest,
    InferResponse,
    ModelVersionInfo,
    ModelVersionState,
    StateBinding,
    WorkerRequest,
)
from shoal.settings import BrokerSettings

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

_MAX_LOAD_FAILURES = 5


@dataclass(slots=True)
class PendingRequest:
    frontend: bytes
    request: InferRequest
    arrival: float          # broker clock (monotonic seconds)
    dispatched: float = 0.0
    exec_id: int = 0        # the id the worker knows it by (unique across frontends)
    worker: str = ""        # identity of the worker running it
    responded: bool = False  # a decoupled request's first response went out
    trace: list[int] | None = None  # a traced request's stamps (broker/trace_stamps.py)
    queued_ns: int = 0      # from arrival to dispatch (counted when the request succeeds)
    batch_id: int = 0       # the Batch it left in
    # a decoupled request still open when its batch's BatchResult came: that execution's
    # durations, counted when its stream ends in success (stats.py)
    compute: BatchTimings | None = None


@dataclass
class InstanceSlot:
    """One configured model instance; ``worker`` is its current process (None while waiting to
    restart or after it gave up)."""

    instance_name: str
    kind: str
    device_id: int
    worker: WorkerHandle | None = None
    failures: int = 0
    restarts: int = 0  # workers started again after a death (dashboard, metrics)
    restart_at: float | None = None
    ever_ready: bool = False
    gave_up: bool = False
    last_exit: str = ""
    rate_needs: InstanceNeeds = field(default_factory=InstanceNeeds)  # --rate-limit: its group's


_RUNTIME_GENERATIONS = itertools.count(1)


@dataclass
class ModelVersionRuntime:
    source: ModelSource
    version: int
    config_json_text: str
    scheduling: RuntimeScheduling  # queue, sequence or iterative (schedulers/scheduling.py)
    instances: list[InstanceSlot]
    stats: ModelVersionStats
    orderer: ResponseOrderer[InferResponse] | None
    state: ModelVersionState = ModelVersionState.LOADING
    reason: str = ""
    requests: dict[RequestKey, PendingRequest] = field(default_factory=dict)
    batches: dict[int, list[RequestKey]] = field(default_factory=dict)
    # per in-flight batch: its rows (the sum of its requests' batch sizes, at dispatch) and,
    # for a decoupled model, how many of its requests ended in success before its BatchResult
    # brought the durations to count for them (``end_batch``)
    batch_rows: dict[int, int] = field(default_factory=dict)
    early_successes: dict[int, int] = field(default_factory=dict)
    by_exec: dict[int, RequestKey] = field(default_factory=dict)
    decoupled: bool = False
    ragged_inputs: frozenset[str] = frozenset()
    ensemble: EnsemblePlan | None = None  # ensembles run no workers of their own
    execution_timeout_s: float = 0.0  # health.py: 0 = no execution deadline
    retiring: bool = False  # its generation drains or failed: no new requests, no restarts
    # unique per runtime of this broker: a reload's answers never come from the response cache
    # entries of the runtime it replaced (ModelVersionInfo.generation is part of their key)
    generation: int = field(default_factory=lambda: next(_RUNTIME_GENERATIONS))

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def config(self) -> ModelConfig:
        return self.source.config

    @cached_property
    def max_batch_size(self) -> int:
        """Read once (it is read per request): a runtime's config never changes."""
        return int(self.source.config.max_batch_size)

    @property
    def backend(self) -> str:
        return backend_name(self.source.config)

    def idle_workers(self) -> list[WorkerHandle]:
        return [s.worker for s in self.instances
                if s.worker is not None and s.worker.state is WorkerState.IDLE]

    def all_ready(self) -> bool:
        return all(s.worker is not None and s.worker.state in (WorkerState.IDLE, WorkerState.BUSY)
                   for s in self.instances)

    def serving(self) -> bool:
        """Some instance serves or will serve soon (loaded once and not given up); an
        ensemble serves while its composing models are ready."""
        if self.retiring:
            return False
        if self.ensemble is not None:
            return self.state is ModelVersionState.READY
        # asked per request: a loop costs less than any() over a generator
        for s in self.instances:  # noqa: SIM110
            if s.ever_ready and not s.gave_up:
                return True
        return False

    def refresh_state(self) -> None:
        if self.state in (ModelVersionState.UNLOADING,) or self.ensemble is not None:
            return  # an ensemble's state follows its composing models (ModelManager)
        if self.all_ready():
            self.state, self.reason = ModelVersionState.READY, ""
        elif any(s.gave_up for s in self.instances) and not self.serving():
            self.state = ModelVersionState.UNAVAILABLE
        elif any(s.ever_ready for s in self.instances):
            down = [s for s in self.instances
                    if s.worker is None or s.worker.state is WorkerState.LOADING]
            self.state = ModelVersionState.UNAVAILABLE
            self.reason = "; ".join(
                f"model instance '{s.instance_name}' {s.last_exit or 'is loading'}, restarting"
                for s in down)

    def info(self) -> ModelVersionInfo:
        inputs, outputs = tensor_specs(self.config)
        return ModelVersionInfo(
            name=self.name, version=self.version, state=self.state, reason=self.reason,
            platform=platform_name(self.config), max_batch_size=self.max_batch_size,
            inputs=inputs, outputs=outputs, decoupled=is_decoupled(self.config),
            config_json=self.config_json_text.encode(), serving=self.serving(),
            response_cache=self.config.response_cache.enable, generation=self.generation)

    def queued(self, key: RequestKey, frontend: bytes, request: InferRequest,
               now: float) -> QueuedRequest:
        in_flight = len(self.requests)  # queued or executing before this one arrived
        pending = self.requests[key] = PendingRequest(frontend, request, now)
        if request.trace:
            pending.trace = queued_stamps()
        # positional: this runs per request (keywords cost more than the fields' assignment)
        return QueuedRequest(key, request.batch_size, now, request.priority, request.timeout_us,
                             self.shape_signature(request), in_flight)

    def shape_signature(self, request: InferRequest) -> Hashable:
        """Requests batch together only when these match: each input's name, dtype and
        non-batch dims, except inputs with ``allow_ragged_batch`` (any length: the worker
        flattens or pads them, Triton's rule)."""
        if self.max_batch_size <= 0:
            return ()
        ragged = self.ragged_inputs
        return tuple([(t.name, t.datatype, tuple(t.shape[1:])) for t in request.inputs
                      if not ragged or t.name not in ragged])

    def start_batch(self, batch_id: int, keys: list[RequestKey], worker: str, now: float,
                    first_exec_id: int, states: Mapping[RequestKey, list[StateBinding]]
                    ) -> list[WorkerRequest]:
        """These queued requests leave for ``worker`` as Batch ``batch_id``: each gets the
        execution id ``first_exec_id + i`` (the worker's request id) and its queue time is
        kept (counted if it succeeds). Returns the Batch's requests, in ``keys`` order."""
        requests: list[WorkerRequest] = []
        rows = 0
        dispatch_ns = 0
        for exec_id, key in enumerate(keys, first_exec_id):
            pending = self.requests[key]
            if pending.exec_id:  # rescheduled (iterative sequence): the worker knows it by it
                exec_id = pending.exec_id
            else:
                pending.queued_ns = int((now - pending.arrival) * 1e9)
            pending.dispatched, pending.worker, pending.exec_id = now, worker, exec_id
            pending.batch_id = batch_id
            if pending.trace is not None:
                dispatch_ns = dispatch_ns or time.monotonic_ns()
                pending.trace[COMPUTE_START] = dispatch_ns
            self.by_exec[exec_id] = key
            r = pending.request
            requests.append(WorkerRequest(
                request_id=exec_id, inputs=r.inputs, outputs=r.outputs,
                parameters=r.parameters, client_request_id=r.client_request_id,
                batch_size=r.batch_size, correlation_id=r.correlation_id, flags=r.flags,
                states=states.get(key, [])))
            rows += r.batch_size
        if self.orderer is not None:
            self.orderer.admit(keys)
        self.batches[batch_id] = keys
        self.batch_rows[batch_id] = rows
        return requests

    def end_batch(self, batch_id: int) -> tuple[list[RequestKey], int, int]:
        """Batch ``batch_id`` is over (its BatchResult came, or its worker died): its request
        keys, its rows and its decoupled requests that succeeded before it ended."""
        return (self.batches.pop(batch_id, []), self.batch_rows.pop(batch_id, 0),
                self.early_successes.pop(batch_id, 0))

    def forget(self, key: RequestKey) -> PendingRequest | None:
        pending = self.requests.pop(key, None)
        if pending is not None and pending.exec_id:
            self.by_exec.pop(pending.exec_id, None)
        return pending

    def drain_queue(self) -> list[RequestKey]:
        """Every request still waiting for an execution (unload / shutdown / no instance)."""
        return self.scheduling.drain()

    def queued_again(self, key: RequestKey) -> QueuedRequest:
        """The scheduler's view of request ``key`` once more (a rescheduled request)."""
        pending = self.requests[key]
        request = pending.request
        return QueuedRequest(key, request.batch_size, pending.arrival, request.priority,
                             request.timeout_us, self.shape_signature(request))

    def gave_up_on(self, slot: InstanceSlot) -> bool:
        return slot.failures >= _MAX_LOAD_FAILURES


def earliest_deadline(runtimes: Iterable[ModelVersionRuntime], now: float,
                      latest: float) -> float:
    """The earliest time at or before ``latest`` at which a version's scheduling (a queue
    delay, a timeout) or a slot's restart timer needs the loop (monotonic seconds)."""
    deadline = latest
    for runtime in runtimes:
        d = runtime.scheduling.deadline(now)
        if d is not None:
            deadline = min(deadline, d)
        for slot in runtime.instances:
            if slot.restart_at is not None:
                deadline = min(deadline, slot.restart_at)
    return deadline


def build_runtime(source: ModelSource, version: int, settings: BrokerSettings, serial: int = 0
                  ) -> ModelVersionRuntime:
    """``serial``: unique per runtime of this broker (names its state segments)."""
    import orjson

    config = source.config
    orderer: ResponseOrderer[InferResponse] | None = None
    if config.max_batch_size > 0 and config.HasField("dynamic_batching"):
        batcher_config = DynamicBatcherConfig.from_model_config(config)
        scheduler: Scheduler = DynamicBatcher(batcher_config)
        if config.dynamic_batching.preserve_ordering:
            orderer = ResponseOrderer()
    else:
        scheduler = DefaultScheduler()
    instances = [InstanceSlot(name, kind, device_id)
                 for name, kind, device_id, _group in instance_names(config)]
    if settings.rate_limit.mode != "off":  # off: Triton ignores resources and priority entirely
        try:
            needs = instance_needs(config)
        except ShoalError as error:
            raise invalid_arg(f"model '{config.name}': {error.message}") from None
        for slot, slot_needs in zip(instances, needs, strict=True):
            slot.rate_needs = slot_needs
    scheduling: RuntimeScheduling = QueueScheduling(scheduler)
    if config.HasField("sequence_batching") and config.sequence_batching.iterative_sequence:
        check_iterative(config)
        scheduling = IterativeScheduling(IterativeScheduler(int(config.max_batch_size)))
    elif config.HasField("sequence_batching"):
        if config.sequence_batching.state and is_decoupled(config):
            raise unsupported(f"model '{config.name}': implicit sequence state ('state' in "
                              "sequence_batching) is not supported for decoupled models")
        states = store_factory(config, source.model_dir,
                               f"{settings.instance.segment_prefix}st{serial}-",
                               settings.shm.segment_bytes, settings.shm.arena_max_bytes)
        scheduling = SequenceScheduling(config, len(instances), states)
    return ModelVersionRuntime(
        source=source, version=version,
        config_json_text=orjson.dumps(config_to_json(config)).decode(),
        scheduling=scheduling, instances=instances,
        stats=ModelVersionStats(source.name, version), orderer=orderer,
        decoupled=is_decoupled(config),
        ragged_inputs=frozenset(io.name for io in config.input if io.allow_ragged_batch),
        execution_timeout_s=execution_timeout(config, settings))


def check_iterative(config: ModelConfig) -> None:
    """What shoal serves of iterative sequences: requests that are sequences of their own,
    without control inputs or implicit state (UNSUPPORTED otherwise, naming the field)."""
    batcher = config.sequence_batching
    for field_name in ("control_input", "state"):
        if len(getattr(batcher, field_name)):
            raise unsupported(f"model '{config.name}': sequence_batching.{field_name} is not "
                              "supported with iterative_sequence")


def execution_timeout(config: ModelConfig, settings: BrokerSettings) -> float:
    """The model parameter ``shoal_execution_timeout_secs`` (0 = none), else the server's
    ``--model-execution-timeout-secs``."""
    parameter = config.parameters.get("shoal_execution_timeout_secs")
    if parameter is None:
        return settings.worker_watch.execution_timeout_secs
    try:
        value = float(parameter.string_value)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise invalid_arg(f"model '{config.name}': parameter shoal_execution_timeout_secs must be "
                          f"a number of seconds >= 0 (0 = no deadline), got "
                          f"'{parameter.string_value}'")
    return value
