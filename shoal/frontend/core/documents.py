"""The JSON documents of the non-infer routes, in Triton's shapes (pure builders)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from shoal.messages import (
    Duration,
    LlmStats,
    ModelStats,
    ModelVersionInfo,
    ModelVersionState,
    RepositorySnapshot,
    TensorSpec,
)

# shoal reports the Triton release whose HTTP/gRPC surface it follows (reference snapshot:
# server 2.73.0 / 26.09), so clients that gate features on the server version behave as with
# that Triton.
TRITON_COMPAT_VERSION: Final = "2.73.0"
SERVER_NAME: Final = "triton"

# Triton's order (core src/server.cc), keeping only what this HTTP layer implements.
BASE_EXTENSIONS: Final = (
    "classification",
    "sequence",
    "model_repository",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
)
UNLOAD_DEPENDENTS_EXTENSION: Final = "model_repository(unload_dependents)"


def server_metadata(model_control: bool, name: str = SERVER_NAME) -> dict[str, Any]:
    """``name``: the server's id (``--id``, default ``triton``)."""
    extensions = list(BASE_EXTENSIONS)
    if model_control:
        extensions.insert(extensions.index("model_repository") + 1, UNLOAD_DEPENDENTS_EXTENSION)
    return {"name": name, "version": TRITON_COMPAT_VERSION, "extensions": extensions}


def _tensor_metadata(spec: TensorSpec, batching: bool) -> dict[str, Any]:
    shape = ([-1] if batching else []) + list(spec.dims)
    return {"name": spec.name, "datatype": spec.datatype, "shape": shape}


def model_metadata(model: ModelVersionInfo, versions: Iterable[int]) -> dict[str, Any]:
    batching = model.max_batch_size > 0
    return {
        "name": model.name,
        "versions": [str(v) for v in versions],
        "platform": model.platform,
        "inputs": [_tensor_metadata(s, batching) for s in model.inputs],
        "outputs": [_tensor_metadata(s, batching) for s in model.outputs],
    }


def repository_index(snapshot: RepositorySnapshot, ready_only: bool) -> list[dict[str, str]]:
    """``[{"name","version","state","reason"?}]`` sorted by name then version; a model with no
    version information appears as ``{"name"}`` (not with ``ready_only``)."""
    entries: list[tuple[str, int, dict[str, str]]] = []
    for info in snapshot.models:
        if ready_only and info.state is not ModelVersionState.READY:
            continue
        entry = {"name": info.name, "version": str(info.version), "state": info.state.value}
        if info.reason:
            entry["reason"] = info.reason
        entries.append((info.name, info.version, entry))
    if not ready_only:
        listed = {info.name for info in snapshot.models}
        for name in snapshot.unloaded:
            if name in listed:
                continue
            entries.append((name, -1, {"name": name}))
    entries.sort(key=lambda item: (item[0], item[1]))
    return [entry for _, _, entry in entries]


def _duration(value: Duration) -> dict[str, int]:
    return {"count": value.count, "ns": value.ns}


def model_statistics(models: Sequence[ModelStats], *, extensions: bool = True
                     ) -> dict[str, Any]:
    """Triton's statistics extension document (durations in ns). ``extensions``: add shoal's
    ``shoal_llm`` field to an llm-backend version's entry (``llm_statistics``); gRPC leaves it
    out, Triton's protobuf has no place for it."""
    return {"model_stats": [_model_stats(stats, extensions) for stats in models]}


def llm_statistics(llm: LlmStats) -> dict[str, Any]:
    """shoal's extension field ``shoal_llm``: the executor figures of an llm-backend version,
    summed over its instances (counters since load, gauges now; durations in Triton's
    ``{count, ns}`` shape; ``time_to_first_token`` / ``inter_token`` are measured in the worker
    when each response leaves it)."""
    return {
        "requests": {"active": llm.active_requests, "queued": llm.queued_requests,
                     "scheduled": llm.scheduled_requests, "context": llm.context_requests,
                     "generation": llm.generation_requests, "paused": llm.paused_requests,
                     "max": llm.max_requests, "finished": llm.requests_finished},
        "kv_cache": {"max_blocks": llm.kv_blocks_max, "free_blocks": llm.kv_blocks_free,
                     "used_blocks": llm.kv_blocks_used,
                     "tokens_per_block": llm.kv_tokens_per_block,
                     "reused_blocks": llm.kv_blocks_reused},
        "tokens": {"prompt": llm.prompt_tokens, "generation": llm.generation_tokens},
        "time_to_first_token": {"count": sum(llm.time_to_first_token),
                                "ns": round(llm.time_to_first_token_us * 1000)},
        "inter_token": {"count": sum(llm.inter_token), "ns": round(llm.inter_token_us * 1000)},
        "iterations": llm.iterations,
        "memory": {"weights_bytes": llm.weights_bytes, "kv_pool_bytes": llm.kv_pool_bytes,
                   "accelerator_bytes": llm.accelerator_bytes},
    }


def _model_stats(stats: ModelStats, extensions: bool = True) -> dict[str, Any]:
    document = _triton_model_stats(stats)
    if extensions and stats.llm is not None:
        document["shoal_llm"] = llm_statistics(stats.llm)
    return document


def _triton_model_stats(stats: ModelStats) -> dict[str, Any]:
    return {
        "name": stats.name,
        "version": str(stats.version),
        "last_inference": stats.last_inference_ms,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "inference_stats": {
            "success": _duration(stats.success),
            "fail": _duration(stats.fail),
            "queue": _duration(stats.queue),
            "compute_input": _duration(stats.compute_input),
            "compute_infer": _duration(stats.compute_infer),
            "compute_output": _duration(stats.compute_output),
            "cache_hit": _duration(stats.cache_hit),
            "cache_miss": _duration(stats.cache_miss),
        },
        "response_stats": {},
        "batch_stats": [
            {
                "batch_size": batch.batch_size,
                "compute_input": _duration(batch.compute_input),
                "compute_infer": _duration(batch.compute_infer),
                "compute_output": _duration(batch.compute_output),
            }
            for batch in stats.batch_stats
        ],
        "memory_usage": [],
    }
