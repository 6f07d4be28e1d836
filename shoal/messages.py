"""Every message that crosses a process boundary (DESIGN §6).

Wire format: a ZeroMQ multipart message whose first frame is one byte, the ``MsgKind``, and whose
second frame is the msgpack encoding of the matching Struct (see ``encode``/``decode``). ROUTER
sockets prepend the peer identity frame as usual. No pickle, no ``Any``.

Sockets (all ``ipc://`` under the server's runtime dir):
  frontend DEALER  ──connect──▶ broker ROUTER  "frontend.sock"
  worker   DEALER  ──connect──▶ broker ROUTER  "worker.sock"   (identity = instance key, utf-8)

Tensors never travel inline: a ``TensorRef`` names a slice of a POSIX shared-memory segment.
"""

from __future__ import annotations

import enum
from typing import Final

import msgspec

from shoal.errors import ErrorCode

# Request/tensor parameters: Triton allows str, int, bool and double.
ParamValue = str | int | float | bool
Params = dict[str, ParamValue]


class Error(msgspec.Struct, frozen=True, array_like=True):
    code: ErrorCode
    message: str


class CudaHandle(msgspec.Struct, frozen=True, array_like=True):
    """A client's CUDA allocation as registered (CUDA shared-memory extension): the 64-byte
    ``cudaIpcMemHandle_t`` of the allocation, the server device ordinal to open it on, and the
    registered size. Workers open it themselves (``shoal.shm.cuda_ipc``), cache the mapping by
    ``(raw_handle, device_id)`` and check ``byte_size`` against the allocation's real size."""

    raw_handle: bytes
    device_id: int
    byte_size: int


class TensorRef(msgspec.Struct, frozen=True, array_like=True):
    """A tensor living in shared memory: ``nbytes`` bytes at ``offset`` of segment ``region``
    (a POSIX shm name such as ``/shoal-<id>-fe1234-0``). ``datatype`` is the wire name; BYTES
    tensors are stored in the 4-byte-length framing (``dtypes.serialize_bytes``).
    A region that does not start with the server's segment prefix is a client-registered object
    (system shared memory extension); readers re-check its real size before touching it.
    With ``cuda`` set the bytes are in a client's CUDA allocation instead: ``region`` is empty
    and ``offset`` counts from the allocation's start."""

    name: str
    datatype: str
    shape: list[int]
    region: str
    offset: int
    nbytes: int
    cuda: CudaHandle | None = None


class OutputTarget(msgspec.Struct, frozen=True, array_like=True):
    """Where a worker writes an output instead of its own arena: ``nbytes`` bytes at ``offset`` of
    the client-registered POSIX shm object ``region`` (its key, e.g. ``/input_data``). The
    frontend checked the bounds against the registration; the worker re-checks the object's real
    size right before writing."""

    region: str
    offset: int
    nbytes: int
    cuda: CudaHandle | None = None  # set: a client CUDA allocation (``region`` is empty)


class RequestedOutput(msgspec.Struct, frozen=True, array_like=True):
    name: str
    parameters: Params = {}
    target: OutputTarget | None = None


class Lease(msgspec.Struct, frozen=True, array_like=True):
    """Output memory that a worker lent to a response. The frontend returns it with
    ``ReleaseLeases`` once it has serialized the outputs; until then the worker must not
    reuse it."""

    instance: str
    lease_id: int


# ---------------------------------------------------------------- frontend <-> broker


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


class InferRequestBatch(msgspec.Struct, frozen=True, array_like=True):
    """frontend -> broker: several InferRequests queued in one event-loop iteration, sent as one
    message (one socket send instead of many under load)."""

    requests: list[InferRequest]


class InferResponseBatch(msgspec.Struct, frozen=True, array_like=True):
    """broker -> frontend: the answers one batch produced for one frontend, as one message."""

    responses: list[InferResponse]


class ReleaseLeases(msgspec.Struct, frozen=True, array_like=True):
    """frontend -> broker -> worker: the frontend is done with these output leases."""

    leases: list[Lease]


class CancelRequest(msgspec.Struct, frozen=True, array_like=True):
    """frontend -> broker: drop a request that has not started executing."""

    request_id: int


class Hello(msgspec.Struct, frozen=True, array_like=True):
    """frontend -> broker, first message on connect; answered with a RepositorySnapshot."""

    frontend_id: str


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


class RepositorySnapshot(msgspec.Struct, frozen=True, array_like=True):
    """broker -> frontend: the full state (sent on Hello and after every state change).
    ``models_ready`` is the strict-readiness verdict (all models have a ready version).
    ``unloaded`` lists model names present in the repository but without any version info."""

    models: list[ModelVersionInfo]
    models_ready: bool
    exiting: bool = False
    unloaded: list[str] = []
    failed: dict[str, str] = {}  # model name -> why it could not be read (config errors)


class StatsRequest(msgspec.Struct, frozen=True, array_like=True):
    """frontend -> broker: ask for statistics (model "" = all models; version -1 = all)."""

    query_id: int
    model: str = ""
    version: int = -1


class Duration(msgspec.Struct, frozen=True, array_like=True):
    count: int
    ns: int


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


class StatsReply(msgspec.Struct, frozen=True, array_like=True):
    query_id: int
    models: list[ModelStats]
    error: Error | None = None


# ---------------------------------------------------------------- broker <-> worker


class StateBinding(msgspec.Struct, frozen=True, array_like=True):
    """One implicit state (``sequence_batching.state``) of one sequence request. The input state
    is ``input_nbytes`` bytes at ``input_offset`` of the broker's segment ``input_region``,
    shaped ``shape``: the worker gives it to the model as input ``input_name``. If the model
    produces output ``output_name``, the worker writes it at ``output_offset`` of
    ``output_region`` (at most ``capacity`` bytes; more fails the request) and reports it in
    ``Result.states``; an output state not produced leaves the state as it was. ``dims``: the
    declared shape of the output (with the batch dim; -1 = any size)."""

    input_name: str
    output_name: str
    datatype: str
    dims: list[int]
    shape: list[int]
    input_region: str
    input_offset: int
    input_nbytes: int
    output_region: str
    output_offset: int
    capacity: int


class WrittenState(msgspec.Struct, frozen=True, array_like=True):
    """worker -> broker, in a Result: the output state ``output_name`` was written (its shape
    and size in bytes), so it is the sequence's next input state."""

    output_name: str
    shape: list[int]
    nbytes: int


class WorkerRequest(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """One request inside a Batch, as the worker sees it. ``request_id`` is the broker's
    execution id (unique across frontends), not the frontend's request id. ``states``: the
    implicit states of a sequence request (see StateBinding)."""

    request_id: int
    inputs: list[TensorRef]
    outputs: list[RequestedOutput] = []
    parameters: Params = {}
    client_request_id: str = ""
    batch_size: int = 1
    correlation_id: int | str = 0
    flags: int = 0
    states: list[StateBinding] = []


class InlineTensor(msgspec.Struct, frozen=True, array_like=True):
    """A tensor the broker generates itself and sends inline (sequence control values: a few
    bytes per row). Client data never travels this way."""

    name: str
    datatype: str
    shape: list[int]
    data: bytes


class Batch(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """broker -> worker: execute these requests together (sum of batch_size <= max_batch_size).

    Sequence batches (sequence_batching models) also carry ``rows``: per batch row, the index of
    its request in ``requests`` or -1 for a not-ready row (zeros shaped like the first request's
    inputs; its outputs are discarded); and ``controls``: the START/END/READY/CORRID tensors of
    the whole batch, one row per entry of ``rows`` (each request gets its own row of them)."""

    batch_id: int
    requests: list[WorkerRequest]
    rows: list[int] = []
    controls: list[InlineTensor] = []


class Result(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """``states``: the output states the worker wrote for this request (implicit state)."""

    request_id: int
    outputs: list[TensorRef] = []
    parameters: Params = {}
    error: Error | None = None
    states: list[WrittenState] = []


class BatchTimings(msgspec.Struct, frozen=True, array_like=True):
    """Worker-side durations of one execution, in ns (Triton's compute_input/infer/output)."""

    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int


class BatchResult(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """worker -> broker: one Result per request of the Batch, in any order. All successful
    Results share ``lease`` (the batch's output memory), released when every one is released."""

    batch_id: int
    results: list[Result]
    timings: BatchTimings
    lease: Lease | None = None


class StreamResponse(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """worker -> broker (from the worker's stream socket): one response of a decoupled model,
    sent as the model produces it. ``request_id`` is the WorkerRequest's id. ``final`` ends the
    request; ``empty`` marks a final carrying no response (COMPLETE_FINAL alone)."""

    request_id: int
    outputs: list[TensorRef] = []
    parameters: Params = {}
    error: Error | None = None
    lease: Lease | None = None
    final: bool = False
    empty: bool = False


class CancelExecuting(msgspec.Struct, frozen=True, array_like=True):
    """broker -> worker (control socket): these running requests were cancelled; the model sees
    ``request.is_cancelled()`` turn true."""

    request_ids: list[int]


class ForgetCudaHandles(msgspec.Struct, frozen=True, array_like=True):
    """frontend -> broker -> every worker (control socket): these CUDA registrations ended and
    no request uses them any more; a worker closes its mapping of each (between batches)."""

    handles: list[CudaHandle]


class WorkerReady(msgspec.Struct, frozen=True, array_like=True):
    """worker -> broker, after the model loaded. ``instance`` equals the socket identity."""

    instance: str
    pid: int


class WorkerLoadFailed(msgspec.Struct, frozen=True, array_like=True):
    instance: str
    message: str


class WorkerShutdown(msgspec.Struct, frozen=True, array_like=True):
    """broker -> worker: finalize the model, unlink own segments, exit 0."""

    reason: str = ""


class MsgKind(bytes, enum.Enum):
    """First frame of every message: one byte naming the Struct in the next frame."""

    INFER_REQUEST = b"\x01"
    INFER_RESPONSE = b"\x02"
    RELEASE_LEASES = b"\x03"
    CANCEL_REQUEST = b"\x04"
    HELLO = b"\x05"
    REPOSITORY_SNAPSHOT = b"\x06"
    STATS_REQUEST = b"\x07"
    STATS_REPLY = b"\x08"
    BATCH = b"\x10"
    BATCH_RESULT = b"\x11"
    WORKER_READY = b"\x12"
    WORKER_LOAD_FAILED = b"\x13"
    WORKER_SHUTDOWN = b"\x14"
    INFER_REQUEST_BATCH = b"\x09"
    INFER_RESPONSE_BATCH = b"\x0a"
    STREAM_RESPONSE = b"\x15"
    CANCEL_EXECUTING = b"\x16"
    FORGET_CUDA_HANDLES = b"\x17"


Message = (
    InferRequest | InferResponse | InferRequestBatch | InferResponseBatch | ReleaseLeases
    | CancelRequest | Hello | RepositorySnapshot
    | StatsRequest | StatsReply | Batch | BatchResult | WorkerReady | WorkerLoadFailed
    | WorkerShutdown | StreamResponse | CancelExecuting | ForgetCudaHandles
)

_KIND_OF: Final[dict[type[msgspec.Struct], MsgKind]] = {
    InferRequest: MsgKind.INFER_REQUEST,
    InferResponse: MsgKind.INFER_RESPONSE,
    InferRequestBatch: MsgKind.INFER_REQUEST_BATCH,
    InferResponseBatch: MsgKind.INFER_RESPONSE_BATCH,
    ReleaseLeases: MsgKind.RELEASE_LEASES,
    CancelRequest: MsgKind.CANCEL_REQUEST,
    Hello: MsgKind.HELLO,
    RepositorySnapshot: MsgKind.REPOSITORY_SNAPSHOT,
    StatsRequest: MsgKind.STATS_REQUEST,
    StatsReply: MsgKind.STATS_REPLY,
    Batch: MsgKind.BATCH,
    BatchResult: MsgKind.BATCH_RESULT,
    WorkerReady: MsgKind.WORKER_READY,
    WorkerLoadFailed: MsgKind.WORKER_LOAD_FAILED,
    WorkerShutdown: MsgKind.WORKER_SHUTDOWN,
    StreamResponse: MsgKind.STREAM_RESPONSE,
    CancelExecuting: MsgKind.CANCEL_EXECUTING,
    ForgetCudaHandles: MsgKind.FORGET_CUDA_HANDLES,
}
_DECODERS: Final[dict[bytes, msgspec.msgpack.Decoder[msgspec.Struct]]] = {
    kind.value: msgspec.msgpack.Decoder(cls) for cls, kind in _KIND_OF.items()
}
_ENCODER: Final = msgspec.msgpack.Encoder()


class UnknownMessage(ValueError):
    """A frame pair that is not a known message (bad kind byte or undecodable body)."""


def encode(message: Message) -> list[bytes]:
    """Message -> [kind byte, body] frames (prepend identity frames for ROUTER sends)."""
    return [_KIND_OF[type(message)].value, _ENCODER.encode(message)]


def decode(frames: list[bytes]) -> Message:
    """The last two frames [kind, body] -> Message; raises UnknownMessage."""
    if len(frames) < 2:
        raise UnknownMessage("expected [kind, body] frames")
    decoder = _DECODERS.get(bytes(frames[-2]))
    if decoder is None:
        raise UnknownMessage(f"unknown message kind {bytes(frames[-2])!r}")
    try:
        return decoder.decode(frames[-1])  # type: ignore[return-value]
    except msgspec.DecodeError as exc:
        raise UnknownMessage(str(exc)) from exc


class WorkerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """broker -> worker process at spawn (JSON in argv): which model instance to serve.
    ``identity`` is unique per spawn (a restarted instance gets a new one) and is the worker's
    DEALER identity; ``arena_prefix`` names the worker's output segments."""

    identity: str
    model_name: str
    model_version: int
    model_dir: str
    version_dir: str
    backend: str
    config_json: str
    instance_name: str
    kind: str
    device_id: int
    broker_endpoint: str
    arena_prefix: str
    settings_json: str
