"""The dashboard's llm rows (``ops/llm_figures.py``) from successive executor figures."""

from __future__ import annotations

from shoal.messages import LATENCY_BUCKET_BOUNDS_US, Duration, LlmStats, ModelStats
from shoal.ops.llm_figures import LlmFigures

BUCKETS = len(LATENCY_BUCKET_BOUNDS_US) + 1


def histogram(**per_bound_us: int) -> list[int]:
    """Counts with ``n`` observations in the bucket of bound ``b`` (``b<bound>=n``)."""
    counts = [0] * BUCKETS
    for key, count in per_bound_us.items():
        counts[LATENCY_BUCKET_BOUNDS_US.index(int(key[1:]))] += count
    return counts


def model(llm: LlmStats | None, name: str = "llm") -> ModelStats:
    zero = Duration(0, 0)
    return ModelStats(name, 1, 0, 0, 0, zero, zero, zero, zero, zero, zero, [], llm=llm)


def test_rates_gauges_and_window_percentiles() -> None:
    figures = LlmFigures(window_s=10.0)
    first = LlmStats(generation_tokens=100, prompt_tokens=40, active_requests=1,
                     time_to_first_token=histogram(b10000=5), inter_token=histogram(b1000=95))
    (row,) = figures.update(0.0, [model(first), model(None, "mlp")])
    assert row.name == "llm" and row.tokens_per_s == 0.0  # no previous reading yet
    assert row.first_tokens == 5  # since load
    later = LlmStats(generation_tokens=300, prompt_tokens=60, active_requests=2,
                     queued_requests=3, kv_blocks_used=7, kv_blocks_free=9, kv_blocks_max=16,
                     time_to_first_token=histogram(b10000=5, b50000=10),
                     inter_token=histogram(b1000=95, b5000=190))
    (row,) = figures.update(2.0, [model(later)])
    assert row.tokens_per_s == 100.0 and row.prompt_tokens_per_s == 10.0
    assert (row.active_requests, row.queued_requests) == (2, 3)
    assert (row.kv_blocks_used, row.kv_blocks_free, row.kv_blocks_max) == (7, 9, 16)
    assert row.window_s == 2.0 and row.first_tokens == 10  # only what came after the first
    assert row.ttft_p50_us is not None and 30_000 < row.ttft_p50_us <= 50_000
    assert row.itl_p99_us is not None and 3_000 < row.itl_p99_us <= 5_000


def test_a_restarted_worker_starts_the_window_afresh() -> None:
    figures = LlmFigures()
    figures.update(0.0, [model(LlmStats(generation_tokens=500,
                                        time_to_first_token=histogram(b10000=9)))])
    (row,) = figures.update(1.0, [model(LlmStats(generation_tokens=20,
                                                 time_to_first_token=histogram(b10000=1)))])
    assert row.tokens_per_s == 0.0 and row.first_tokens == 1


def test_versions_without_executor_figures_give_no_row() -> None:
    assert LlmFigures().update(0.0, [model(None)]) == []
