"""Iteration and per-request statistics, shaped like TensorRT-LLM's IterationStats /
RequestStatsPerIteration (``get_latest_iteration_stats`` / ``get_latest_request_stats``).

``InflightBatchingStats.num_gen_tokens`` is an addition: the generation-phase tokens of the
iteration (one per generating beam or sequence), so ``num_ctx_tokens + num_gen_tokens`` is
every token the iteration computed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


@dataclass(frozen=True)
class KvCacheStats:
    max_num_blocks: int
    free_num_blocks: int
    used_num_blocks: int
    tokens_per_block: int
    alloc_total_blocks: int  # blocks handed out since the executor started
    alloc_new_blocks: int  # blocks handed out in this iteration (copy-on-write copies included)
    # block reuse (all 0 with it off): context blocks found in the cache / computed, since the
    # executor started, and reused / (reused + missed)
    reused_blocks: int = 0
    missed_blocks: int = 0
    cache_hit_rate: float = 0.0


@dataclass(frozen=True)
class InflightBatchingStats:
    num_scheduled_requests: int
    num_context_requests: int
    num_gen_requests: int
    num_paused_requests: int  # paused in this iteration to free KV blocks (MAX_UTILIZATION)
    num_ctx_tokens: int
    num_gen_tokens: int
    micro_batch_id: int = 0


@dataclass(frozen=True)
class IterationStats:
    timestamp: str  # local time the iteration ended, "%m-%d-%Y %H:%M:%S.%f" as in TRT-LLM
    iter: int
    iter_latency_ms: float
    num_active_requests: int  # admitted requests during the iteration (finished ones included)
    max_num_active_requests: int
    num_queued_requests: int  # enqueued, not yet admitted (paused requests included)
    num_new_active_requests: int
    num_completed_requests: int
    kv_cache_stats: KvCacheStats
    inflight_batching_stats: InflightBatchingStats


class RequestStage(enum.Enum):
    QUEUED = "queued"
    CONTEXT_IN_PROGRESS = "context_in_progress"
    GENERATION_IN_PROGRESS = "generation_in_progress"
    GENERATION_COMPLETE = "generation_complete"


@dataclass(frozen=True)
class RequestStats:
    id: int
    stage: RequestStage
    context_prefill_position: int  # prompt tokens whose KV is cached
    num_generated_tokens: int  # per sequence, the longest
    scheduled: bool
    paused: bool
    num_kv_blocks: int  # blocks the request holds after the iteration
    avg_num_decoded_tokens_per_iter: float = 1.0
    reused_blocks_per_request: int = 0  # context blocks taken from the cache (block reuse)
    missed_blocks_per_request: int = 0  # context blocks computed


@dataclass(frozen=True)
class RequestStatsPerIteration:
    iter: int
    request_stats: list[RequestStats] = field(default_factory=list)
