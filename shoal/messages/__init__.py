"""Every message that crosses a process boundary (docs/architecture.md §2).

Wire format: a ZeroMQ multipart message whose first frame is one byte, the ``MsgKind``, and whose
second frame is the msgpack encoding of the matching Struct (see ``encode``/``decode``). ROUTER
sockets prepend the peer identity frame as usual. No pickle, no ``Any``.

Sockets (all ``ipc://`` under the server's runtime dir):
  frontend DEALER  ──connect──▶ broker ROUTER  "frontend.sock"
  worker   DEALER  ──connect──▶ broker ROUTER  "worker.sock"   (identity = instance key, utf-8)

Tensors never travel inline: a ``TensorRef`` names a slice of a POSIX shared-memory segment (or
of a client's CUDA allocation).

Layout: the Structs live in ``tensors`` (the parts: tensor references, errors, leases),
``frontend`` (frontend <-> broker), ``worker`` (broker <-> worker, and the spawn spec) and
``metrics`` (models' custom metrics, worker -> broker -> frontend), ``llm`` (llm-backend
executor figures, worker -> broker -> frontend); this
module is the wire (``MsgKind``, ``encode``, ``decode``) and re-exports every Struct. Import from
``shoal.messages``.
"""

from __future__ import annotations

import enum
from typing import Final

import msgspec

from shoal.messages.frontend import (
    LATENCY_BUCKET_BOUNDS_US,
    BatchStat,
    CacheFigures,
    CancelRequest,
    ClientRegion,
    ControlReply,
    DeviceMemory,
    DeviceMemoryHolder,
    Duration,
    Hello,
    InferRequest,
    InferRequestBatch,
    InferResponse,
    InferResponseBatch,
    LatencyHistogram,
    LoadModel,
    ModelCacheFigures,
    ModelLoadStats,
    ModelStats,
    ModelVersionInfo,
    ModelVersionState,
    RegionRegistered,
    RegionUnregistered,
    ReleaseLeases,
    RepositorySnapshot,
    StatsReply,
    StatsRequest,
    TensorSpec,
    TraceStamps,
    UnloadModel,
)
from shoal.messages.llm import TOKEN_LEN_BOUNDS, LlmStats
from shoal.messages.metrics import CustomMetric, CustomMetricFamily, CustomMetricKind
from shoal.messages.tensors import (
    CudaHandle,
    Error,
    InlineTensor,
    Lease,
    OutputTarget,
    Params,
    ParamValue,
    RequestedOutput,
    TensorRef,
)
from shoal.messages.worker import (
    Batch,
    BatchResult,
    BatchTimings,
    CancelExecuting,
    CollectCustomMetrics,
    CustomMetricsSnapshot,
    ForgetCudaHandles,
    Heartbeat,
    LogLevel,
    Result,
    StateBinding,
    StreamResponse,
    StreamResponses,
    WorkerLoadFailed,
    WorkerReady,
    WorkerRequest,
    WorkerShutdown,
    WorkerSpec,
    WrittenState,
)


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
    LOAD_MODEL = b"\x0b"
    UNLOAD_MODEL = b"\x0c"
    CONTROL_REPLY = b"\x0d"
    REGION_REGISTERED = b"\x0e"
    REGION_UNREGISTERED = b"\x0f"
    HEARTBEAT = b"\x18"
    STREAM_RESPONSES = b"\x19"
    CACHE_FIGURES = b"\x20"
    LOG_LEVEL = b"\x21"
    COLLECT_CUSTOM_METRICS = b"\x22"
    CUSTOM_METRICS_SNAPSHOT = b"\x23"


Message = (
    InferRequest | InferResponse | InferRequestBatch | InferResponseBatch | ReleaseLeases
    | CancelRequest | Hello | RepositorySnapshot | RegionRegistered | RegionUnregistered
    | StatsRequest | StatsReply | Batch | BatchResult | WorkerReady | WorkerLoadFailed
    | WorkerShutdown | StreamResponse | StreamResponses | CancelExecuting | ForgetCudaHandles
    | LoadModel | UnloadModel | ControlReply | Heartbeat | CacheFigures | LogLevel
    | CollectCustomMetrics | CustomMetricsSnapshot
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
    StreamResponses: MsgKind.STREAM_RESPONSES,
    CancelExecuting: MsgKind.CANCEL_EXECUTING,
    ForgetCudaHandles: MsgKind.FORGET_CUDA_HANDLES,
    LogLevel: MsgKind.LOG_LEVEL,
    LoadModel: MsgKind.LOAD_MODEL,
    UnloadModel: MsgKind.UNLOAD_MODEL,
    ControlReply: MsgKind.CONTROL_REPLY,
    RegionRegistered: MsgKind.REGION_REGISTERED,
    RegionUnregistered: MsgKind.REGION_UNREGISTERED,
    Heartbeat: MsgKind.HEARTBEAT,
    CacheFigures: MsgKind.CACHE_FIGURES,
    CollectCustomMetrics: MsgKind.COLLECT_CUSTOM_METRICS,
    CustomMetricsSnapshot: MsgKind.CUSTOM_METRICS_SNAPSHOT,
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


__all__ = [
    "LATENCY_BUCKET_BOUNDS_US",
    "TOKEN_LEN_BOUNDS",
    "Batch",
    "BatchResult",
    "BatchStat",
    "BatchTimings",
    "CacheFigures",
    "CancelExecuting",
    "CancelRequest",
    "ClientRegion",
    "CollectCustomMetrics",
    "ControlReply",
    "CudaHandle",
    "CustomMetric",
    "CustomMetricFamily",
    "CustomMetricKind",
    "CustomMetricsSnapshot",
    "DeviceMemory",
    "DeviceMemoryHolder",
    "Duration",
    "Error",
    "ForgetCudaHandles",
    "Heartbeat",
    "Hello",
    "InferRequest",
    "InferRequestBatch",
    "InferResponse",
    "InferResponseBatch",
    "InlineTensor",
    "LatencyHistogram",
    "Lease",
    "LlmStats",
    "LoadModel",
    "LogLevel",
    "Message",
    "ModelCacheFigures",
    "ModelLoadStats",
    "ModelStats",
    "ModelVersionInfo",
    "ModelVersionState",
    "MsgKind",
    "OutputTarget",
    "ParamValue",
    "Params",
    "RegionRegistered",
    "RegionUnregistered",
    "ReleaseLeases",
    "RepositorySnapshot",
    "RequestedOutput",
    "Result",
    "StateBinding",
    "StatsReply",
    "StatsRequest",
    "StreamResponse",
    "StreamResponses",
    "TensorRef",
    "TensorSpec",
    "TraceStamps",
    "UnknownMessage",
    "UnloadModel",
    "WorkerLoadFailed",
    "WorkerReady",
    "WorkerRequest",
    "WorkerShutdown",
    "WorkerSpec",
    "WrittenState",
    "decode",
    "encode",
]
