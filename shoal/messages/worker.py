"""Messages between the broker and its workers, and a worker's spawn spec (see
``shoal.messages``)."""

from __future__ import annotations

import msgspec

from shoal.messages.llm import LlmStats
from shoal.messages.metrics import CustomMetricFamily
from shoal.messages.tensors import (
    CudaHandle,
    Error,
    InlineTensor,
    Lease,
    Params,
    RequestedOutput,
    TensorRef,
)
from shoal.settings import WorkerSettings


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


class Batch(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """broker -> worker: execute these requests together (sum of batch_size <= max_batch_size).

    Sequence batches (sequence_batching models) also carry ``rows``: per batch row, the index of
    its request in ``requests`` or -1 for a not-ready row (zeros shaped like the first request's
    inputs; its outputs are discarded); and ``controls``: the START/END/READY/CORRID tensors of
    the whole batch, one row per entry of ``rows`` (each request gets its own row of them).

    ``releases``: output leases of this worker that their holders gave back while it was busy
    (``broker/held_releases.py``); the worker frees them before executing the batch, as it
    would a ReleaseLeases read just before it."""

    batch_id: int
    requests: list[WorkerRequest]
    rows: list[int] = []
    controls: list[InlineTensor] = []
    releases: list[Lease] = []


class Result(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """``states``: the output states the worker wrote for this request (implicit state)."""

    request_id: int
    outputs: list[TensorRef] = []
    parameters: Params = {}
    error: Error | None = None
    states: list[WrittenState] = []


class BatchTimings(msgspec.Struct, frozen=True, array_like=True):
    """Worker-side durations of one execution, in ns (Triton's compute_input/infer/output).
    ``start_ns``: when the worker began it, on CLOCK_MONOTONIC (``time.monotonic_ns``, the
    clock of every process): the phases' absolute times for traced requests."""

    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int
    start_ns: int = 0


class BatchResult(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """worker -> broker: one Result per request of the Batch, in any order. All successful
    Results share ``lease`` (the batch's output memory), released when every one is released.
    ``rescheduled``: the ids of requests the model released with RESCHEDULE (iterative
    sequences): no Result; the broker runs them again on this instance."""

    batch_id: int
    results: list[Result]
    timings: BatchTimings
    lease: Lease | None = None
    rescheduled: list[int] = []


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


class StreamResponses(msgspec.Struct, frozen=True, array_like=True):
    """worker -> broker (stream socket): StreamResponses sent together, in order, as one
    message (a decoupled model answering many requests at once, e.g. the tokens of one LLM
    iteration: ``InstanceContext.stream_batch``)."""

    responses: list[StreamResponse]


class CancelExecuting(msgspec.Struct, frozen=True, array_like=True):
    """broker -> worker (control socket): these running requests were cancelled; the model sees
    ``request.is_cancelled()`` turn true."""

    request_ids: list[int]


class ForgetCudaHandles(msgspec.Struct, frozen=True, array_like=True):
    """frontend -> broker -> every worker (control socket): these CUDA registrations ended and
    no request uses them any more; a worker closes its mapping of each (between batches)."""

    handles: list[CudaHandle]


class LogLevel(msgspec.Struct, frozen=True, array_like=True):
    """frontend -> broker -> every worker (control socket): the logging extension's settings
    changed (``POST /v2/logging``, gRPC ``LogSettings``); the broker and each worker set their
    root logger to ``level`` (a Python logging level), so the settings hold server-wide as in
    Triton (a model's ``pb_utils.Logger`` writes in its worker). A worker that becomes ready
    later gets the broker's last one."""

    level: int


class CollectCustomMetrics(msgspec.Struct, frozen=True, array_like=True):
    """broker -> worker (control socket): a ``/metrics`` scrape wants this worker's custom
    metrics as they are now (the model may be inside ``execute``, having just set one); the
    control thread answers at once with ``CustomMetricsSnapshot`` carrying ``token``."""

    token: int


class CustomMetricsSnapshot(msgspec.Struct, frozen=True, array_like=True):
    """worker -> broker (control socket): every custom metric family of the worker now, for
    the scrape ``token``."""

    token: int
    custom_metrics: list[CustomMetricFamily]


class WorkerReady(msgspec.Struct, frozen=True, array_like=True):
    """worker -> broker, after the model loaded. ``instance`` equals the socket identity."""

    instance: str
    pid: int


class WorkerLoadFailed(msgspec.Struct, frozen=True, array_like=True):
    instance: str
    message: str


class Heartbeat(msgspec.Struct, frozen=True, array_like=True):
    """worker -> broker, every HEARTBEAT_INTERVAL_S from the worker's control thread (never from
    the thread that runs the model): the process runs and its interpreter is not wedged. A
    worker silent for ``--worker-heartbeat-timeout-secs`` is killed and replaced.
    ``custom_metrics``: the worker's custom metrics (``pb_utils.MetricFamily``), all of them,
    when they changed since the last heartbeat that carried them; None: unchanged.
    ``llm``: an llm-backend instance's executor figures, on every heartbeat (None: not one)."""

    pid: int
    custom_metrics: list[CustomMetricFamily] | None = None
    llm: LlmStats | None = None


HEARTBEAT_INTERVAL_S = 1.0


class WorkerShutdown(msgspec.Struct, frozen=True, array_like=True):
    """broker -> worker: finalize the model, unlink own segments, exit 0."""

    reason: str = ""


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
    settings: WorkerSettings  # the server's settings a worker uses
    # The server's default intra-op thread count for this CPU instance (broker/thread_policy.py);
    # 0: none (accelerator instances). Backends apply it unless the model names a count.
    intra_op_threads: int = 0
    # The logging API's last change before this spawn, as a Python logging level (0: none, the
    # settings' flags hold): applied before the worker serves, so its first batch logs at it.
    log_level: int = 0
