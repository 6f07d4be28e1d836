"""Messages between a frontend and the broker (see ``shoal.messages``)."""

from __future__ import annotations

import enum
from typing import Final

import msgspec

from shoal.messages.llm import LlmStats
from shoal.messages.metrics import CustomMetricFamily
from shoal.messages.tensors import CudaHandle, Error, Lease, Params, RequestedOutput, TensorRef


class InferRequest(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """frontend -> broker. ``request_id`` is unique per frontend (the broker keys on
    (frontend identity, request_id)). ``version`` -1 means "by version policy" (highest ready).
    ``batch_size`` is the leading dim when the model batches (max_batch_size > 0), else 1.
    The input TensorRefs point into the frontend's arena; the frontend keeps them alive until it
    receives the matching InferResponse."""

    request_id: int
    model: str
    version: int
    inputs: list[TensorRef]
    outputs: list[RequestedOutput] = []
    parameters: Params = {}
    client_request_id: str = ""
    batch_size: int = 1
    priority: int = 0
    timeout_us: int = 0
    correlation_id: int | str = 0
    flags: int = 0
    trace: bool = False  # sampled for tracing: the broker stamps it (InferResponse.trace)


class TraceStamps(msgspec.Struct, frozen=True, array_like=True):
    """broker -> frontend, in the terminal answer of a traced request: Triton's trace
    timestamps taken past the frontend, in ns of CLOCK_MONOTONIC (``time.monotonic_ns``, one
    clock for every process); 0 = not reached. ``queue_start``: the broker queued it;
    ``compute_start``: the broker handed its batch to a worker; the rest are the worker's
    phases of that batch (inputs ready, model returned, outputs written)."""

    queue_start: int = 0
    compute_start: int = 0
    compute_input_end: int = 0
    compute_output_start: int = 0
    compute_end: int = 0


class InferResponse(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """broker -> frontend: an answer to an InferRequest. Exactly one of ``error`` and the outputs
    is meaningful. ``lease`` (when set) must be released by the frontend. A non-decoupled model
    answers once (``final`` True). A decoupled model answers 0..N times with ``final`` False and
    ends with ``final`` True; ``empty`` marks a final answer that carries no response of the
    model (Triton's flags-only COMPLETE_FINAL)."""

    request_id: int
    model_version: int = 0
    outputs: list[TensorRef] = []
    parameters: Params = {}
    error: Error | None = None
    lease: Lease | None = None
    final: bool = True
    empty: bool = False
    trace: TraceStamps | None = None  # a traced request's terminal answer (InferRequest.trace)


class InferRequestBatch(msgspec.Struct, frozen=True, array_like=True):
    """frontend -> broker: several InferRequests queued in one event-loop iteration, sent as one
    message (one socket send instead of many under load). ``releases``: output leases the
    sender is done with, riding on this message instead of a ReleaseLeases of their own; the
    broker treats them exactly as a ReleaseLeases received just before the requests."""

    requests: list[InferRequest]
    releases: list[Lease] = []


class InferResponseBatch(msgspec.Struct, frozen=True, array_like=True):
    """broker -> frontend: the answers one batch produced for one frontend, as one message."""

    responses: list[InferResponse]


class ReleaseLeases(msgspec.Struct, frozen=True, array_like=True):
    """frontend -> broker -> worker: the frontend is done with these output leases. Sent
    alone only when nothing else is going that way: a frontend's releases ride on its
    InferRequestBatch, the broker's on the worker's next Batch (``broker/held_releases.py``)."""

    leases: list[Lease]


class CancelRequest(msgspec.Struct, frozen=True, array_like=True):
    """frontend -> broker: drop a request that has not started executing."""

    request_id: int


class Hello(msgspec.Struct, frozen=True, array_like=True):
    """frontend -> broker, first message on connect; answered with the RegionRegistered
    messages kept for ``frontend_index`` (a restarted frontend's registrations), then a
    RepositorySnapshot. ``frontend_index``: the frontend process's index (0 serves /metrics);
    -1 for a connection that is not a frontend process (a worker's BLS link)."""

    frontend_id: str
    frontend_index: int = -1


class ClientRegion(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """A client shared-memory registration (Triton's system or CUDA shm extension) as the
    frontend that took it holds it. System: ``key`` names the client's POSIX object, the region
    is ``[offset, +byte_size)`` of it, and ``object_dev`` / ``object_ino`` the identity of the
    object registered (a frontend that takes the registration over after a restart serves only
    that object). CUDA: ``cuda`` is the allocation (``key`` empty)."""

    name: str
    key: str = ""
    offset: int = 0
    byte_size: int = 0
    cuda: CudaHandle | None = None
    object_dev: int = 0
    object_ino: int = 0


class RegionRegistered(msgspec.Struct, frozen=True, array_like=True):
    """frontend -> broker: frontend ``frontend_index`` registered ``region``. The broker keeps
    the registrations per index and sends them back (broker -> frontend, the same message)
    when a frontend of that index says Hello, so a frontend restarted after a crash serves its
    clients' regions without their registering again."""

    frontend_index: int
    region: ClientRegion


class RegionUnregistered(msgspec.Struct, frozen=True, array_like=True):
    """frontend -> broker: the registration ``name`` of frontend ``frontend_index`` ended
    (unregistered, or it could not be restored after a restart)."""

    frontend_index: int
    name: str


class LoadModel(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """frontend (or a BLS-calling worker) -> broker: load or reload ``model`` (explicit mode).
    ``config``: a ModelConfig JSON that replaces config.pbtxt ("" = none); ``files``:
    ``file:<version>/<path>`` -> bytes (needs ``config``). Checked by the sender and again by
    the broker before anything touches disk. Answered with ControlReply once the load is done
    (READY, or failed with the old version still serving)."""

    query_id: int
    model: str
    config: str = ""
    files: dict[str, bytes] = {}


class UnloadModel(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """frontend -> broker: stop serving ``model`` (explicit mode). Answered with ControlReply as
    soon as new requests are refused (Triton's unload is asynchronous); the old version drains
    its queued and running requests, then its workers stop."""

    query_id: int
    model: str
    unload_dependents: bool = False


class ControlReply(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """broker -> frontend: the end of a LoadModel / UnloadModel. It is sent after the
    RepositorySnapshot that shows the new state."""

    query_id: int
    error: Error | None = None


class TensorSpec(msgspec.Struct, frozen=True, array_like=True):
    """One input or output as the frontend needs it for validation and metadata.
    ``dims`` excludes the batch dim; ``optional`` only applies to inputs."""

    name: str
    datatype: str
    dims: list[int]
    optional: bool = False
    reshape: list[int] | None = None


class ModelVersionState(enum.StrEnum):
    UNKNOWN = "UNKNOWN"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


class ModelVersionInfo(msgspec.Struct, frozen=True, array_like=True):
    """Read-only view of one model version, pushed by the broker to every frontend.
    ``config_json`` is the completed, normalized config as Triton serves it on /config."""

    name: str
    version: int
    state: ModelVersionState
    reason: str
    platform: str
    max_batch_size: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    decoupled: bool
    config_json: bytes
    serving: bool = True  # accepts inference (READY, or an instance restarting with work queued)
    response_cache: bool = False  # config's response_cache.enable (frontend/response_cache/)
    generation: int = 0  # the broker's runtime of this version: a reload brings a new one


class ModelLoadStats(msgspec.Struct, frozen=True, array_like=True):
    """Load / unload events of one model since the server started (metrics)."""

    name: str
    loads: int
    failures: int
    unloads: int
    last_load_seconds: float


class RepositorySnapshot(msgspec.Struct, frozen=True, array_like=True):
    """broker -> frontend: the full state (sent on Hello and after every state change).
    ``models_ready`` is the strict-readiness verdict (all models have a ready version).
    ``unloaded`` lists model names present in the repository but without any version info
    (the repository index shows them by name only, as Triton does)."""

    models: list[ModelVersionInfo]
    models_ready: bool
    exiting: bool = False
    unloaded: list[str] = []
    load_stats: list[ModelLoadStats] = []


class StatsRequest(msgspec.Struct, frozen=True, array_like=True):
    """frontend -> broker: ask for statistics (model "" = all models; version -1 = all).
    ``custom_metrics``: a ``/metrics`` scrape, answered with the workers' custom metrics as
    they are when it arrives (the broker asks each serving worker first)."""

    query_id: int
    model: str = ""
    version: int = -1
    custom_metrics: bool = False


class Duration(msgspec.Struct, frozen=True, array_like=True):
    count: int
    ns: int


def _latency_bounds_us() -> tuple[int, ...]:
    steps = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
    return (*(int(s * 10**k) for k in range(1, 8) for s in steps), 10**8)


# Upper bounds (µs, inclusive) of the latency histogram buckets in ModelStats: 1, 1.5, 2, 3, 5, 7
# per decade from 10 µs to 100 s. Every 1-2-5 bound is one of them (Triton's default histogram
# buckets 100 / 500 / 2000 / 5000 ms among them), so coarser Prometheus buckets sum exactly.
LATENCY_BUCKET_BOUNDS_US: Final[tuple[int, ...]] = _latency_bounds_us()


class LatencyHistogram(msgspec.Struct, frozen=True, array_like=True):
    """Counts of durations per bucket (not cumulative): ``counts[i]`` holds the durations in
    (bound[i-1], bound[i]] of LATENCY_BUCKET_BOUNDS_US, and the one extra last entry those above
    the last bound. Empty (``[]``) until the first duration is recorded."""

    counts: list[int] = []


class BatchStat(msgspec.Struct, frozen=True, array_like=True):
    batch_size: int
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration


class ModelStats(msgspec.Struct, frozen=True, array_like=True):
    """Triton's statistics extension, per model version (durations in ns)."""

    name: str
    version: int
    last_inference_ms: int
    inference_count: int
    execution_count: int
    success: Duration
    fail: Duration
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration
    batch_stats: list[BatchStat]
    pending: int = 0
    fail_by_reason: dict[str, int] = {}
    # Operations view (dashboard, histogram / summary metrics); not part of Triton's extension.
    in_flight: int = 0  # requests sent to a worker and not yet answered
    request_latency: LatencyHistogram = LatencyHistogram()  # arrival -> end, successes only
    queue_latency: LatencyHistogram = LatencyHistogram()  # arrival -> sent to a worker
    compute_latency: LatencyHistogram = LatencyHistogram()  # compute input + infer + output
    first_response_latency: LatencyHistogram = LatencyHistogram()  # arrival -> first response
    instance_restarts: dict[str, int] = {}  # instance name -> worker restarts since loaded
    # per request, as compute_input/infer/output above (summary metrics)
    compute_input_latency: LatencyHistogram = LatencyHistogram()
    compute_infer_latency: LatencyHistogram = LatencyHistogram()
    compute_output_latency: LatencyHistogram = LatencyHistogram()
    first_response: Duration = Duration(0, 0)  # count and sum of first_response_latency
    llm: LlmStats | None = None  # llm backend: executor figures summed over the live instances
    # response cache (Triton's cache_hit / cache_miss): hits answered by a frontend's cache
    # (lookup + extract), misses (lookup + insertion); reported by the frontends (CacheFigures)
    cache_hit: Duration = Duration(0, 0)
    cache_miss: Duration = Duration(0, 0)


class ModelCacheFigures(msgspec.Struct, frozen=True, array_like=True):
    """One model version's response-cache figures since the frontend's last report: hits and
    their lookup + extract time, misses and their lookup + insertion time (ns)."""

    model: str
    version: int
    hits: int = 0
    hit_ns: int = 0
    misses: int = 0
    miss_ns: int = 0


class CacheFigures(msgspec.Struct, frozen=True, array_like=True):
    """frontend -> broker: response-cache figures (increments) of the frontend's own cache,
    sent before each of its StatsRequests and at most a second after a change; the broker adds
    them to the versions' statistics (a hit also counts as a success, Triton's rule)."""

    figures: list[ModelCacheFigures]


class DeviceMemoryHolder(msgspec.Struct, frozen=True, array_like=True):
    """Bytes of one device that the device-memory ledger reserves for a model, by part:
    ``weights``, ``kv_pool`` (llm backend), ``workspace``, ``margin``."""

    model: str
    part: str
    nbytes: int


class DeviceMemory(msgspec.Struct, frozen=True, array_like=True):
    """One GPU's row of the broker's device-memory ledger (``capacity`` / ``limit`` -1:
    unknown, admission unchecked)."""

    device: int
    capacity: int
    limit: int
    reserved: int
    holders: list[DeviceMemoryHolder] = []


class StatsReply(msgspec.Struct, frozen=True, array_like=True):
    """``custom_metrics``: the models' custom metrics merged over the live workers;
    ``devices``: the device-memory ledger; both only in the answer to an all-models query
    (``StatsRequest.model`` "")."""

    query_id: int
    models: list[ModelStats]
    error: Error | None = None
    custom_metrics: list[CustomMetricFamily] = []
    devices: list[DeviceMemory] = []
