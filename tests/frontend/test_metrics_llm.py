"""``/metrics`` families of llm-backend models (``frontend/metrics/llm.py``) from
``ModelStats.llm``: TensorRT-LLM backend names and labels, exact histograms."""

from __future__ import annotations

from shoal.frontend.metrics.app import render_prometheus
from shoal.messages import (
    LATENCY_BUCKET_BOUNDS_US,
    TOKEN_LEN_BOUNDS,
    Duration,
    LlmStats,
    ModelStats,
)

ZERO = Duration(0, 0)


def stats(llm: LlmStats | None) -> ModelStats:
    return ModelStats("llm", 1, 0, 0, 0, ZERO, ZERO, ZERO, ZERO, ZERO, ZERO, [], llm=llm)


def counts_at(bounds: tuple[int, ...], **at: int) -> list[int]:
    counts = [0] * (len(bounds) + 1)
    for key, count in at.items():
        counts[bounds.index(int(key[1:]))] += count
    return counts


def test_gauges_counters_and_histograms_in_triton_names() -> None:
    llm = LlmStats(
        active_requests=2, queued_requests=1, max_requests=8, kv_blocks_max=10,
        kv_blocks_free=6, kv_blocks_used=4, kv_tokens_per_block=32, iterations=17,
        prompt_tokens=30, generation_tokens=12, finished_generation_tokens=9,
        kv_pool_bytes=1000, weights_bytes=500,
        time_to_first_token=counts_at(LATENCY_BUCKET_BOUNDS_US, b3000=2, b50000=1),
        time_to_first_token_us=56000.0,
        input_token_len=counts_at(TOKEN_LEN_BOUNDS, b10=3),
        output_token_len=counts_at(TOKEN_LEN_BOUNDS, b5=1, b10=1))
    lines = set(render_prometheus([stats(llm), stats(None)]).splitlines())
    for line in (
            'nv_trt_llm_request_metrics{model="llm",request_type="active",version="1"} 2.0',
            'nv_trt_llm_request_metrics{model="llm",request_type="waiting",version="1"} 1.0',
            'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="llm",'
            'version="1"} 4.0',
            'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="llm",'
            'version="1"} 0.4',
            'nv_trt_llm_runtime_memory_metrics{memory_type="cpu",model="llm",version="1"} 1500.0',
            'nv_trt_llm_general_metrics{general_type="iteration_counter",model="llm",'
            'version="1"} 17.0',
            "# TYPE nv_llm_prompt_tokens counter",
            'nv_llm_prompt_tokens{model="llm",version="1"} 30',
            'nv_llm_generation_tokens{model="llm",version="1"} 12',
            'nv_llm_input_token_len_bucket{le="10",model="llm",response_metric_type='
            '"total_input_tokens",version="1"} 3.0',
            'nv_llm_input_token_len_sum{model="llm",response_metric_type="total_input_tokens",'
            'version="1"} 30.0',
            'nv_llm_output_token_len_sum{model="llm",response_metric_type="total_output_tokens",'
            'version="1"} 9.0',
            'nv_llm_time_to_first_token_ms_bucket{le="2",model="llm",version="1"} 0.0',
            'nv_llm_time_to_first_token_ms_bucket{le="5",model="llm",version="1"} 2.0',
            'nv_llm_time_to_first_token_ms_bucket{le="50",model="llm",version="1"} 3.0',
            'nv_llm_time_to_first_token_ms_count{model="llm",version="1"} 3.0',
            'nv_llm_time_to_first_token_ms_sum{model="llm",version="1"} 56.0'):
        assert line in lines, line


def test_no_llm_model_no_llm_family() -> None:
    assert "nv_trt_llm" not in render_prometheus([stats(None)])
