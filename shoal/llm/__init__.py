"""LLM executor: in-flight batching over a paged KV cache with TensorRT-LLM's Executor API
(``tensorrt_llm.bindings.executor`` names, in snake_case). Independent of the broker and the
frontend; usable in-process::

    from shoal.llm import Executor, ExecutorConfig, Request

    with Executor("path/to/hf-checkpoint", ExecutorConfig(max_batch_size=32)) as executor:
        request_id = executor.enqueue_request(Request([1, 2, 3], max_tokens=16))
        for response in executor.await_responses(request_id, timeout=10.0):
            print(response.result.output_token_ids)
"""

from __future__ import annotations

from shoal.llm.config import (
    BatchingType,
    CapacitySchedulerPolicy,
    ExecutorConfig,
    KvCacheConfig,
    SchedulerConfig,
)
from shoal.llm.executor import Executor
from shoal.llm.logits import LogitsPostProcessorConfig
from shoal.llm.request import (
    FinishReason,
    OutputConfig,
    Request,
    Response,
    Result,
    SamplingConfig,
)
from shoal.llm.stats import (
    InflightBatchingStats,
    IterationStats,
    KvCacheStats,
    RequestStage,
    RequestStats,
    RequestStatsPerIteration,
)

__all__ = [
    "BatchingType",
    "CapacitySchedulerPolicy",
    "Executor",
    "ExecutorConfig",
    "FinishReason",
    "InflightBatchingStats",
    "IterationStats",
    "KvCacheConfig",
    "KvCacheStats",
    "LogitsPostProcessorConfig",
    "OutputConfig",
    "Request",
    "RequestStage",
    "RequestStats",
    "RequestStatsPerIteration",
    "Response",
    "Result",
    "SamplingConfig",
    "SchedulerConfig",
]
