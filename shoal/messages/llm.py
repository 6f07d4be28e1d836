"""Executor figures of an ``llm``-backend model instance, as they cross processes.

The worker's llm backend keeps them (``workers/backends/llm/figures.py``); the worker's control
thread ships them on every heartbeat (``Heartbeat.llm``); the broker keeps the last set of each
live worker and sums the instances of a version into ``ModelStats.llm``. Frontend 0 renders them
on ``/metrics`` (TensorRT-LLM backend names), the statistics documents carry them, and the ops
sampler turns them into the dashboard's ``llm`` rows.

Counters and histograms count since the instance loaded (a restarted worker starts again from
zero); gauges are the state at the instance's last look (after the executor's latest pass,
every iteration while requests are open). Latency histograms count durations in µs in the
buckets of ``LATENCY_BUCKET_BOUNDS_US`` (``messages/frontend.py``: one entry per bound plus one
overflow entry, not cumulative; ``[]`` until the first observation), token-length histograms in
the buckets of ``TOKEN_LEN_BOUNDS`` (same layout).
"""

from __future__ import annotations

from typing import Final

import msgspec

# Upper bounds (tokens, inclusive) of the prompt / output length histograms: the 1-2-5 steps to
# 1,000, as TensorRT-LLM's Triton backend builds nv_llm_input_token_len / nv_llm_output_token_len
# (build_1_2_5_buckets(1000)).
TOKEN_LEN_BOUNDS: Final[tuple[int, ...]] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


class LlmStats(msgspec.Struct, frozen=True, array_like=True, kw_only=True):
    """One instance's executor figures (or their sum over a version's instances)."""

    # requests (gauges), as TensorRT-LLM's IterationStats after the last iteration
    active_requests: int = 0  # in the running batch (admitted, not finished)
    queued_requests: int = 0  # enqueued, waiting to be admitted (paused ones included)
    scheduled_requests: int = 0  # computed in the last iteration
    context_requests: int = 0  # of those, in their context (prefill) phase
    generation_requests: int = 0  # of those, generating
    paused_requests: int = 0  # paused in the last iteration to free blocks
    max_requests: int = 0  # the executor's max batch size
    context_tokens: int = 0  # prompt tokens computed in the last iteration
    # KV cache (gauges, blocks; reused: a counter)
    kv_blocks_max: int = 0
    kv_blocks_free: int = 0
    kv_blocks_used: int = 0
    kv_tokens_per_block: int = 0
    kv_blocks_reused: int = 0  # blocks taken from the prefix cache instead of computed
    # memory (bytes) on the instance's device
    kv_pool_bytes: int = 0
    weights_bytes: int = 0
    accelerator_bytes: int = 0  # of those two, held on an accelerator (0 on a CPU instance)
    # counters since load
    iterations: int = 0
    requests_finished: int = 0  # requests whose final response left the worker
    prompt_tokens: int = 0  # of the requests the executor accepted
    generation_tokens: int = 0  # generated tokens that left (an end token included)
    finished_generation_tokens: int = 0  # of those, of finished requests (output_token_len)
    # histograms: time to first token / between tokens (µs), per-request token lengths
    time_to_first_token: list[int] = []
    time_to_first_token_us: float = 0.0  # sum
    inter_token: list[int] = []
    inter_token_us: float = 0.0  # sum
    input_token_len: list[int] = []
    output_token_len: list[int] = []

    @property
    def cpu_bytes(self) -> int:
        """Weights and KV pool held in host memory."""
        return self.kv_pool_bytes + self.weights_bytes - self.accelerator_bytes
