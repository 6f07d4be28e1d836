"""Block reuse and chunked context through the Executor: outputs equal those computed without
them (and Hugging Face greedy), the statistics show the reuse, chunks keep generations going."""

from __future__ import annotations

import pathlib
import random
from collections.abc import Callable

import torch
import torch.nn.functional as F

from shoal.llm import (
    CapacitySchedulerPolicy,
    Executor,
    ExecutorConfig,
    KvCacheConfig,
    OutputConfig,
    Request,
    Result,
    SamplingConfig,
    SchedulerConfig,
)
from shoal.llm.attention import SequenceSpan, build_attention_batch, paged_attention
from shoal.llm.kv_cache import BlockManager
from tests.llm.conftest import collect, hf_greedy

MakeExecutor = Callable[..., Executor]
BLOCK = 4


def prompt_of(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 128) for _ in range(length)]


def config(*, reuse: bool = True, chunked: bool = False, max_num_tokens: int = 8192,
           num_blocks: int | None = None, request_stats: int = 0,
           max_beam_width: int = 1) -> ExecutorConfig:
    return ExecutorConfig(
        max_batch_size=8, max_beam_width=max_beam_width, max_num_tokens=max_num_tokens,
        enable_chunked_context=chunked,
        kv_cache_config=KvCacheConfig(tokens_per_block=BLOCK, num_blocks=num_blocks,
                                      enable_block_reuse=reuse),
        request_stats_max_iterations=request_stats)


def run(executor: Executor, requests: list[Request]) -> list[Result]:
    ids = executor.enqueue_requests(requests)
    got = collect(executor, ids, timeout=120)
    results = []
    for request_id in ids:
        final = got[request_id][-1]
        assert not final.has_error(), final.error_msg
        assert final.result is not None and final.result.is_final
        results.append(final.result)
    return results


def generated(result: Result, prompt: list[int]) -> list[list[int]]:
    return [tokens[len(prompt):] for tokens in result.output_token_ids]


def test_extend_span_attends_to_cached_keys_and_its_own_causal_keys() -> None:
    torch.manual_seed(0)
    heads, kv_heads, dim, cached, new = 4, 2, 8, 6, 10
    total = cached + new
    q = torch.randn(total, heads, dim)
    k, v = torch.randn(total, kv_heads, dim), torch.randn(total, kv_heads, dim)
    blocks = BlockManager(8, BLOCK)
    table: list[int] = []
    blocks.prepare_write(table, 0, cached)
    layer_cache = torch.zeros(2, 8 * BLOCK, kv_heads, dim)
    slots = torch.tensor(blocks.slots(table, 0, cached))
    layer_cache[0, slots], layer_cache[1, slots] = k[:cached], v[:cached]
    blocks.prepare_write(table, cached, new)
    batch = build_attention_batch([SequenceSpan(0, new, cached, table)], blocks, "cpu")
    out = paged_attention(q[cached:], k[cached:], v[cached:], layer_cache, batch, scale=0.3)
    expected = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        is_causal=True, scale=0.3, enable_gqa=True)[0].transpose(0, 1)
    assert torch.allclose(out, expected[cached:], atol=1e-5)


def test_same_prompt_twice_reuses_blocks_and_matches_hf(model_dir: pathlib.Path,
                                                        make_executor: MakeExecutor) -> None:
    prompt = prompt_of(1, 41)  # 10 full blocks + 1 token
    executor = make_executor(model_dir, config(request_stats=100))
    expected = hf_greedy(model_dir, prompt, 12)
    (first,) = run(executor, [Request(prompt, 12)])
    stats = executor.get_latest_iteration_stats()[-1].kv_cache_stats
    assert (stats.reused_blocks, stats.missed_blocks) == (0, 11)
    executor.get_latest_request_stats()
    (second,) = run(executor, [Request(prompt, 12)])
    assert generated(first, prompt) == generated(second, prompt) == [expected]
    stats = executor.get_latest_iteration_stats()[-1].kv_cache_stats
    assert (stats.reused_blocks, stats.missed_blocks) == (10, 12)
    assert stats.cache_hit_rate == 10 / 22
    per_request = executor.get_latest_request_stats()[0].request_stats[0]
    assert per_request.reused_blocks_per_request == 10
    assert per_request.missed_blocks_per_request == 1
    # a prompt that shares only its first 5 blocks reuses exactly those
    other = prompt[:20] + prompt_of(2, 15)
    (third,) = run(executor, [Request(other, 6)])
    assert generated(third, other) == [hf_greedy(model_dir, other, 6)]
    assert executor.get_latest_iteration_stats()[-1].kv_cache_stats.reused_blocks == 15


def test_generated_text_is_reused_by_a_follow_up_turn(llama_dir: pathlib.Path,
                                                      make_executor: MakeExecutor) -> None:
    prompt = prompt_of(3, 13)
    executor = make_executor(llama_dir, config())
    (first,) = run(executor, [Request(prompt, 20)])
    follow_up = first.output_token_ids[0] + prompt_of(4, 5)  # the answer, then a new turn
    (second,) = run(executor, [Request(follow_up, 8)])
    assert generated(second, follow_up) == [hf_greedy(llama_dir, follow_up, 8)]
    stats = executor.get_latest_iteration_stats()[-1].kv_cache_stats
    assert stats.reused_blocks >= 7  # the prompt's and the answer's full blocks (32 tokens)


def test_seeded_sampling_and_beams_are_identical_with_and_without_reuse(
        llama_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    prompt = prompt_of(5, 30)
    sampled = Request(prompt, 16, sampling_config=SamplingConfig(
        temperature=0.9, top_k=20, seed=7, num_return_sequences=2))
    beams = Request(prompt, 10, sampling_config=SamplingConfig(beam_width=3))
    outputs = []
    for reuse in (False, True):
        executor = make_executor(llama_dir, config(reuse=reuse, max_beam_width=3))
        run(executor, [Request(prompt, 1)])  # with reuse on, the prompt is cached after this
        outputs.append([r.output_token_ids for r in run(executor, [sampled, beams])])
        executor.shutdown()
    assert outputs[0] == outputs[1]


def test_chunked_context_equals_one_shot_prefill(model_dir: pathlib.Path,
                                                 make_executor: MakeExecutor) -> None:
    prompt = prompt_of(6, 150)
    output = OutputConfig(return_generation_logits=True)
    results = []
    for chunked in (False, True):
        executor = make_executor(model_dir, config(reuse=False, chunked=chunked,
                                                   max_num_tokens=32))
        (result,) = run(executor, [Request(prompt, 8, output_config=output)])
        results.append(result)
        stats = executor.get_latest_iteration_stats()
        if chunked:  # 150 tokens in chunks of 32: five iterations before the first token
            assert [s.inflight_batching_stats.num_ctx_tokens for s in stats[:5]] == [
                32, 32, 32, 32, 22]
        executor.shutdown()
    one_shot, chunks = results
    assert one_shot.generation_logits is not None and chunks.generation_logits is not None
    assert torch.allclose(one_shot.generation_logits, chunks.generation_logits, atol=1e-4)
    assert generated(chunks, prompt) == generated(one_shot, prompt) == [
        hf_greedy(model_dir, prompt, 8)]


def test_chunked_context_keeps_running_generations_going(
        llama_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    budget = 24
    executor = make_executor(llama_dir, config(chunked=True, max_num_tokens=budget))
    short = [prompt_of(10 + i, 6) for i in range(2)]
    long_prompt = prompt_of(12, 200)
    short_ids = executor.enqueue_requests([Request(p, 40, streaming=True) for p in short])
    # both are generating before the long prompt arrives
    early = {i: executor.await_responses(i, timeout=30) for i in short_ids}
    assert all(early.values())
    executor.get_latest_iteration_stats()
    long_id = executor.enqueue_request(Request(long_prompt, 4))
    got = collect(executor, [*short_ids, long_id], timeout=120)
    for request_id, responses in early.items():
        got[request_id] = responses + got[request_id]
    context_iterations = [s.inflight_batching_stats for s in executor.get_latest_iteration_stats()
                          if s.inflight_batching_stats.num_ctx_tokens]
    assert len(context_iterations) >= 200 // budget  # the prompt was spread over iterations
    for batch in context_iterations:
        assert batch.num_gen_requests == 2  # neither generation missed an iteration
        assert batch.num_ctx_tokens + batch.num_gen_tokens <= budget
    for prompt, request_id in [*zip(short, short_ids, strict=True),
                               (long_prompt, long_id)]:
        tokens = [t for r in got[request_id] if r.result is not None
                  for t in r.result.output_token_ids[0]]
        max_tokens = 4 if request_id == long_id else 40
        assert tokens[-max_tokens:] == hf_greedy(llama_dir, prompt, max_tokens)


def test_short_pool_evicts_and_outputs_stay_correct(llama_dir: pathlib.Path,
                                                    make_executor: MakeExecutor) -> None:
    # 24 blocks: room for one request at a time, so each new prompt evicts older blocks
    executor = make_executor(llama_dir, config(chunked=True, max_num_tokens=16,
                                               num_blocks=24))
    prompts = [prompt_of(20 + i, 60) for i in range(3)]
    for prompt in [*prompts, prompts[-1], prompts[0]]:
        (result,) = run(executor, [Request(prompt, 8)])
        assert generated(result, prompt) == [hf_greedy(llama_dir, prompt, 8)]
    stats = executor.get_latest_iteration_stats()[-1].kv_cache_stats
    assert stats.reused_blocks >= 14  # the repeat of the last prompt found its blocks
    assert stats.used_num_blocks == 0 and stats.free_num_blocks == 24


def test_pauses_under_a_short_pool_with_shared_prefixes_keep_outputs(
        llama_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    # MAX_UTILIZATION pauses requests when blocks run out; the paused ones share their prefix
    # with running ones (a pause frees only the blocks nobody else holds) and resume from
    # whatever of their own blocks is still cached
    executor = make_executor(llama_dir, ExecutorConfig(
        max_batch_size=8, max_num_tokens=64, enable_chunked_context=True,
        scheduler_config=SchedulerConfig(CapacitySchedulerPolicy.MAX_UTILIZATION),
        kv_cache_config=KvCacheConfig(tokens_per_block=BLOCK, num_blocks=48)))
    system = prompt_of(30, 40)
    prompts = [system + prompt_of(31 + i, 3) for i in range(5)]
    results = run(executor, [Request(p, 40) for p in prompts])
    for prompt, result in zip(prompts, results, strict=True):
        assert generated(result, prompt) == [hf_greedy(llama_dir, prompt, 40)]
    stats = executor.get_latest_iteration_stats()
    assert sum(s.inflight_batching_stats.num_paused_requests for s in stats) > 0
    assert stats[-1].kv_cache_stats.reused_blocks > 0
    assert stats[-1].kv_cache_stats.used_num_blocks == 0
