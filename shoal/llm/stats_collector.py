"""Collects ``IterationStats`` / ``RequestStatsPerIteration`` after each iteration (loop
thread) and hands them out on request (any thread)."""

from __future__ import annotations

import datetime
import threading
from collections import deque
from typing import TYPE_CHECKING

from shoal.llm.config import ExecutorConfig
from shoal.llm.kv_cache import BlockManager
from shoal.llm.stats import (
    InflightBatchingStats,
    IterationStats,
    KvCacheStats,
    RequestStage,
    RequestStats,
    RequestStatsPerIteration,
)

if TYPE_CHECKING:
    from shoal.llm.engine import Engine, StepReport
    from shoal.llm.sequence import RequestState


class StatsCollector:
    def __init__(self, config: ExecutorConfig, blocks: BlockManager) -> None:
        self._config = config
        self._blocks = blocks
        self._lock = threading.Lock()
        self._iterations: deque[IterationStats] = deque(maxlen=config.iter_stats_max_iterations)
        self._requests: deque[RequestStatsPerIteration] = deque(
            maxlen=config.request_stats_max_iterations)
        self._iteration = 0

    def record(self, report: StepReport, engine: Engine, latency_ms: float) -> None:
        self._iteration += 1
        running = len(engine.scheduler.running)
        blocks = self._blocks
        stats = IterationStats(
            timestamp=datetime.datetime.now().strftime("%m-%d-%Y %H:%M:%S.%f"),
            iter=self._iteration,
            iter_latency_ms=latency_ms,
            num_active_requests=running + len(report.completed),
            max_num_active_requests=self._config.max_batch_size,
            num_queued_requests=len(engine.scheduler.waiting),
            num_new_active_requests=report.num_new,
            num_completed_requests=len(report.completed),
            kv_cache_stats=KvCacheStats(
                max_num_blocks=blocks.num_blocks, free_num_blocks=blocks.free_blocks,
                used_num_blocks=blocks.used_blocks, tokens_per_block=blocks.tokens_per_block,
                alloc_total_blocks=blocks.alloc_total_blocks,
                alloc_new_blocks=blocks.alloc_new_blocks, reused_blocks=blocks.reused_blocks,
                missed_blocks=blocks.missed_blocks, cache_hit_rate=blocks.cache_hit_rate),
            inflight_batching_stats=InflightBatchingStats(
                num_scheduled_requests=len(report.scheduled),
                num_context_requests=len(report.context_ids),
                num_gen_requests=len(report.scheduled) - len(report.context_ids),
                num_paused_requests=report.num_paused,
                num_ctx_tokens=report.num_ctx_tokens,
                num_gen_tokens=report.num_gen_tokens),
        )
        per_request = None
        if self._config.request_stats_max_iterations > 0:
            per_request = self._request_stats(report, engine)
        with self._lock:
            if self._config.iter_stats_max_iterations > 0:
                self._iterations.append(stats)
            if per_request is not None:
                self._requests.append(per_request)

    def _request_stats(self, report: StepReport, engine: Engine) -> RequestStatsPerIteration:
        scheduled = {s.request_id for s in report.scheduled}
        completed = set(report.completed)
        running = {s.request_id for s in engine.scheduler.running}
        states = list(engine.requests.values())
        states += [s for s in report.scheduled if s.request_id in completed]
        entries = []
        for state in states:
            if state.request_id in completed:
                stage = RequestStage.GENERATION_COMPLETE
            elif state.request_id in report.context_ids:
                stage = RequestStage.CONTEXT_IN_PROGRESS
            elif state.request_id in running:
                stage = RequestStage.GENERATION_IN_PROGRESS
            else:
                stage = RequestStage.QUEUED
            entries.append(RequestStats(
                id=state.request_id, stage=stage,
                context_prefill_position=_prefill_position(state),
                num_generated_tokens=state.max_generated(),
                scheduled=state.request_id in scheduled, paused=state.paused,
                num_kv_blocks=state.held_blocks(),
                reused_blocks_per_request=state.reused_blocks,
                missed_blocks_per_request=state.missed_blocks))
        return RequestStatsPerIteration(iter=self._iteration, request_stats=entries)

    def take_iterations(self) -> list[IterationStats]:
        with self._lock:
            taken = list(self._iterations)
            self._iterations.clear()
        return taken

    def take_requests(self) -> list[RequestStatsPerIteration]:
        with self._lock:
            taken = list(self._requests)
            self._requests.clear()
        return taken


def _prefill_position(state: RequestState) -> int:
    prompt = len(state.request.input_token_ids)
    if not state.active:
        return prompt
    return min(prompt, min(s.num_cached for s in state.active))
