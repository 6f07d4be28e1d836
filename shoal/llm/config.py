"""Executor configuration, named after TensorRT-LLM's ``tensorrt_llm.bindings.executor``.

``ExecutorConfig`` fixes everything that is decided once per executor: the largest beam width,
the batch limits of one iteration (``max_batch_size`` requests, ``max_num_tokens`` tokens), the
paged KV cache (``KvCacheConfig``: ``tokens_per_block`` and the pool size) and the scheduling
policy (``SchedulerConfig``). Differences from TRT-LLM, on purpose: ``tokens_per_block`` lives in
``KvCacheConfig`` (TRT-LLM fixes it when the engine is built; here there is no build step), and
``device`` / ``dtype`` say where and in what precision the checkpoint is loaded.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from shoal.llm.guided.params import GuidedDecodingConfig
from shoal.llm.logits.config import LogitsPostProcessorConfig


class CapacitySchedulerPolicy(enum.Enum):
    """How the scheduler spends KV-cache blocks.

    GUARANTEED_NO_EVICT admits a request only when the blocks it could need until it finishes
    (prompt + max_tokens, for every beam / returned sequence) are free after what running
    requests have reserved, so a running request is never paused. MAX_UTILIZATION admits while
    the blocks for the next iteration are free and, when blocks run out, pauses the most
    recently admitted requests (their blocks are freed; they resume later by recomputing their
    KV cache, and their output is unchanged)."""

    MAX_UTILIZATION = "max_utilization"
    GUARANTEED_NO_EVICT = "guaranteed_no_evict"


class BatchingType(enum.Enum):
    """INFLIGHT: requests join and leave the batch at every iteration. STATIC: a batch is formed
    only when the previous one has drained completely (requests wait for the whole batch)."""

    STATIC = "static"
    INFLIGHT = "inflight"


@dataclass(frozen=True)
class KvCacheConfig:
    """Size of the paged KV cache: ``num_blocks`` blocks of ``tokens_per_block`` tokens. Give
    ``num_blocks`` or ``max_tokens`` (rounded up to whole blocks); with neither, the pool holds
    ``max_batch_size * max_beam_width`` sequences of ``max_seq_len`` tokens.
    ``enable_block_reuse``: full blocks of computed prompts (and generated text) stay cached
    and a request whose prompt starts with the same tokens reuses them instead of computing
    them again (default on, as TensorRT-LLM's Executor API has it; see ``prefix_cache.py``)."""

    tokens_per_block: int = 32
    max_tokens: int | None = None
    num_blocks: int | None = None
    enable_block_reuse: bool = True


@dataclass(frozen=True)
class SchedulerConfig:
    capacity_scheduler_policy: CapacitySchedulerPolicy = (
        CapacitySchedulerPolicy.GUARANTEED_NO_EVICT)


@dataclass(frozen=True)
class ExecutorConfig:
    """``max_num_tokens`` bounds the tokens one iteration computes (context tokens + one token
    per generating sequence); a context longer than it runs alone in its iteration.
    ``max_seq_len`` (prompt + generated tokens) defaults to the model's position limit.
    ``iter_stats_max_iterations`` / ``request_stats_max_iterations`` bound the statistics kept
    between two ``get_latest_*_stats`` calls (0 turns per-request statistics off, as in
    TRT-LLM). ``dtype`` None means the checkpoint's dtype on accelerators and float32 on CPU.
    ``enable_chunked_context``: a context longer than the iteration's token budget is computed
    over several iterations, in chunks of whole KV blocks that fill what the generating
    requests leave of ``max_num_tokens`` (TRT-LLM's chunked context; off by default as there).
    ``max_queue_size``: the most requests waiting to be admitted to a batch; one more is refused
    (UNAVAILABLE) at enqueue. 0: no limit (TRT-LLM's ``maxQueueSize``)."""

    max_beam_width: int = 1
    max_batch_size: int = 64
    max_num_tokens: int = 8192
    max_seq_len: int | None = None
    batching_type: BatchingType = BatchingType.INFLIGHT
    enable_chunked_context: bool = False
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv_cache_config: KvCacheConfig = field(default_factory=KvCacheConfig)
    iter_stats_max_iterations: int = 1000
    request_stats_max_iterations: int = 0
    max_queue_size: int = 0
    device: str = "cpu"
    dtype: str | None = None
    logits_post_processor_config: LogitsPostProcessorConfig | None = None
    # the tokenizer guided requests' grammars are compiled for; None: guided decoding is off
    guided_decoding_config: GuidedDecodingConfig | None = None

    def __post_init__(self) -> None:
        positive = {"max_beam_width": self.max_beam_width, "max_batch_size": self.max_batch_size,
                    "max_num_tokens": self.max_num_tokens,
                    "kv_cache_config.tokens_per_block": self.kv_cache_config.tokens_per_block}
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"ExecutorConfig.{name} must be >= 1, got {value}")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise ValueError(f"ExecutorConfig.max_seq_len must be >= 2, got {self.max_seq_len}")
        kv = self.kv_cache_config
        for name, maybe in (("max_tokens", kv.max_tokens), ("num_blocks", kv.num_blocks)):
            if maybe is not None and maybe < 1:
                raise ValueError(f"ExecutorConfig.kv_cache_config.{name} must be >= 1, "
                                 f"got {maybe}")
        for name, count in (("iter_stats_max_iterations", self.iter_stats_max_iterations),
                            ("request_stats_max_iterations", self.request_stats_max_iterations)):
            if count < 0:
                raise ValueError(f"ExecutorConfig.{name} must be >= 0, got {count}")
