"""Metric families of ``llm``-backend models, from ``ModelStats.llm`` (the executor figures
each instance reports on its heartbeat, summed per version by the broker).

Names follow TensorRT-LLM's Triton backend (``custom_metrics_reporter``: gauges with the labels
``model``, ``version`` and one sub-label; histograms ``nv_llm_input_token_len`` /
``nv_llm_output_token_len`` with ``response_metric_type``). Where that backend has no metric,
the name is ``nv_llm_*`` (shoal's, in the same style):

- ``nv_trt_llm_request_metrics{request_type=active|max|scheduled|context|waiting}``
- ``nv_trt_llm_runtime_memory_metrics{memory_type=cpu|gpu|pinned}``: the instance's weights and
  KV pool, as bytes on its device (``pinned`` is 0)
- ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max|free|used|tokens_per|reused|
  fraction}`` (``reused``: blocks taken from the prefix cache since load)
- ``nv_trt_llm_inflight_batcher_metrics{inflight_batcher_specific_metric=total_context_tokens|
  generation_requests|micro_batch_id|paused_requests}``
- ``nv_trt_llm_general_metrics{general_type=iteration_counter}``
- ``nv_llm_input_token_len`` / ``nv_llm_output_token_len`` histograms (tokens per request)
- shoal's: ``nv_llm_prompt_tokens`` / ``nv_llm_generation_tokens`` counters (no ``_total``, as
  Triton's counters), ``nv_llm_time_to_first_token_ms`` / ``nv_llm_inter_token_latency_ms``
  histograms (ms, as Triton's ``nv_inference_first_response_histogram_ms``; measured in the
  worker when each response leaves for the broker, see ``workers/backends/llm/figures.py``).

The writer sorts labels by name (``le`` too). The latency buckets are bounds of the worker's µs
buckets (``LATENCY_BUCKET_BOUNDS_US``), so each cumulative count is exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Final

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from shoal.frontend.metrics.exposition import counter_family, number
from shoal.frontend.metrics.latency import cumulative_counts
from shoal.messages import TOKEN_LEN_BOUNDS, LlmStats, ModelStats

# histogram bounds in ms: the 1-2-5 steps from 0.5 ms to 10 s
LATENCY_BUCKETS_MS: Final = (0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)

_Gauges = tuple[str, str, str, tuple[tuple[str, Callable[[LlmStats], float]], ...]]
GAUGES: Final[tuple[_Gauges, ...]] = (
    ("nv_trt_llm_request_metrics", "TRT LLM request metrics", "request_type", (
        ("active", lambda s: s.active_requests),
        ("max", lambda s: s.max_requests),
        ("scheduled", lambda s: s.scheduled_requests),
        ("context", lambda s: s.context_requests),
        ("waiting", lambda s: s.queued_requests))),
    ("nv_trt_llm_runtime_memory_metrics", "TRT LLM runtime memory metrics", "memory_type", (
        ("cpu", lambda s: s.cpu_bytes),
        ("gpu", lambda s: s.accelerator_bytes),
        ("pinned", lambda s: 0))),
    ("nv_trt_llm_kv_cache_block_metrics", "TRT LLM KV cache block metrics",
     "kv_cache_block_type", (
         ("max", lambda s: s.kv_blocks_max),
         ("free", lambda s: s.kv_blocks_free),
         ("used", lambda s: s.kv_blocks_used),
         ("tokens_per", lambda s: s.kv_tokens_per_block),
         ("reused", lambda s: s.kv_blocks_reused),
         ("fraction", lambda s: s.kv_blocks_used / s.kv_blocks_max if s.kv_blocks_max else 0.0))),
    ("nv_trt_llm_inflight_batcher_metrics", "TRT LLM inflight_batcher-specific metrics",
     "inflight_batcher_specific_metric", (
         ("total_context_tokens", lambda s: s.context_tokens),
         ("generation_requests", lambda s: s.generation_requests),
         ("micro_batch_id", lambda s: 0),
         ("paused_requests", lambda s: s.paused_requests))),
    ("nv_trt_llm_general_metrics", "General TRT LLM metrics", "general_type", (
        ("iteration_counter", lambda s: s.iterations),)),
)

TOKEN_HISTOGRAMS: Final[tuple[tuple[str, str, str, Callable[[LlmStats], list[int]]], ...]] = (
    ("nv_llm_input_token_len", "response_metric_type", "total_input_tokens",
     lambda s: s.input_token_len),
    ("nv_llm_output_token_len", "response_metric_type", "total_output_tokens",
     lambda s: s.output_token_len),
)

COUNTERS: Final[tuple[tuple[str, str, Callable[[LlmStats], int]], ...]] = (
    ("nv_llm_prompt_tokens", "Prompt tokens of the requests the LLM executor accepted",
     lambda s: s.prompt_tokens),
    ("nv_llm_generation_tokens", "Tokens the LLM executor generated and sent (the end token "
     "included)", lambda s: s.generation_tokens),
)

LATENCY_HISTOGRAMS: Final[tuple[tuple[str, str, Callable[[LlmStats], list[int]],
                                      Callable[[LlmStats], float]], ...]] = (
    ("nv_llm_time_to_first_token_ms", "Time from a request's arrival at the worker to its first "
     "token leaving it, in milliseconds", lambda s: s.time_to_first_token,
     lambda s: s.time_to_first_token_us),
    ("nv_llm_inter_token_latency_ms", "Time between two tokens of a request leaving the worker, "
     "in milliseconds", lambda s: s.inter_token, lambda s: s.inter_token_us),
)

FAMILY_NAMES: Final = frozenset(
    [name for name, _, _, _ in GAUGES] + [
        "nv_llm_input_token_len", "nv_llm_output_token_len", "nv_llm_prompt_tokens",
        "nv_llm_generation_tokens", "nv_llm_time_to_first_token_ms",
        "nv_llm_inter_token_latency_ms"])


def llm_families(stats: Sequence[ModelStats]) -> Iterator[Metric]:
    """The families above for every version whose statistics carry executor figures."""
    rows = sorted(((s.name, s.version, s.llm) for s in stats if s.llm is not None),
                  key=lambda row: (row[0], row[1]))
    for name, text, label, series in GAUGES:
        family = Metric(name, text, "gauge")
        for model, version, llm in rows:
            for kind, value in series:
                labels = {"model": model, "version": str(version), label: kind}
                family.add_sample(name, dict(sorted(labels.items())), float(value(llm)))
        yield family
    for name, label, kind, counts_of in TOKEN_HISTOGRAMS:
        histogram = HistogramMetricFamily(name, "TRT LLM response metrics",
                                          labels=("model", label, "version"))
        for model, version, llm in rows:
            counts = counts_of(llm) or [0] * (len(TOKEN_LEN_BOUNDS) + 1)
            total = llm.prompt_tokens if name == "nv_llm_input_token_len" \
                else llm.finished_generation_tokens
            histogram.add_metric((model, kind, str(version)),
                                 _buckets(counts, [float(b) for b in TOKEN_LEN_BOUNDS]),
                                 float(total))
        yield histogram
    for name, text, of in COUNTERS:
        counter = counter_family(name, text)
        for model, version, llm in rows:
            counter.add_sample(name, {"model": model, "version": str(version)}, of(llm))
        yield counter
    for name, text, hist, sum_us in LATENCY_HISTOGRAMS:
        latency = HistogramMetricFamily(name, text, labels=("model", "version"))
        uppers_us = [round(ms * 1000) for ms in LATENCY_BUCKETS_MS]
        for model, version, llm in rows:
            counts = hist(llm)
            cumulative = cumulative_counts(counts, uppers_us) if counts \
                else [0] * len(uppers_us)
            buckets = [(number(ms), float(c)) for ms, c in zip(LATENCY_BUCKETS_MS, cumulative,
                                                               strict=True)]
            buckets.append(("+Inf", float(sum(counts))))
            latency.add_metric((model, str(version)), buckets, sum_us(llm) / 1000.0)
        yield latency


def _buckets(counts: Sequence[int], bounds: Sequence[float]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip([*bounds, float("inf")], counts, strict=True):
        running += count
        out.append((number(bound), float(running)))
    return out

