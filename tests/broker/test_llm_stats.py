"""A version's executor figures: the sum over its instances (``broker/llm_stats.py``)."""

from __future__ import annotations

from shoal.broker.llm_stats import sum_llm_stats
from shoal.messages import LlmStats


def test_instances_add_up_and_tokens_per_block_is_taken() -> None:
    a = LlmStats(active_requests=1, kv_blocks_used=3, kv_blocks_max=10, kv_tokens_per_block=32,
                 generation_tokens=50, time_to_first_token=[1, 2, 0], time_to_first_token_us=7.5)
    b = LlmStats(active_requests=2, kv_blocks_used=4, kv_blocks_max=10, kv_tokens_per_block=32,
                 generation_tokens=25, time_to_first_token=[], inter_token=[0, 0, 3])
    total = sum_llm_stats([a, None, b])
    assert total is not None
    assert (total.active_requests, total.kv_blocks_used, total.kv_blocks_max) == (3, 7, 20)
    assert total.kv_tokens_per_block == 32 and total.generation_tokens == 75
    assert total.time_to_first_token == [1, 2, 0] and total.time_to_first_token_us == 7.5
    assert total.inter_token == [0, 0, 3]


def test_no_figures_is_none() -> None:
    assert sum_llm_stats([None, None]) is None
    one = LlmStats(iterations=4)
    assert sum_llm_stats([one]) is one
