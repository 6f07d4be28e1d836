"""The correctness oracle: the executor's greedy and beam-search outputs equal Hugging Face
generate() token for token on tiny random Llama and GPT-2 checkpoints (float32, CPU)."""

from __future__ import annotations

import pathlib
import random
import time
from collections.abc import Callable

import pytest
import torch

from shoal.llm import (
    CapacitySchedulerPolicy,
    Executor,
    ExecutorConfig,
    FinishReason,
    KvCacheConfig,
    OutputConfig,
    Request,
    SamplingConfig,
    SchedulerConfig,
)
from tests.llm.conftest import collect, hf_beams, hf_greedy, hf_model

MakeExecutor = Callable[..., Executor]


def random_prompt(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(3, 128) for _ in range(rng.randrange(low, high + 1))]


def final_tokens(executor: Executor, ids: list[int]) -> dict[int, list[int]]:
    got = collect(executor, ids)
    out = {}
    for request_id, responses in got.items():
        assert not responses[-1].has_error(), responses[-1].error_msg
        result = responses[-1].result
        assert result is not None and result.is_final
        out[request_id] = result.output_token_ids[0]
    return out


def test_one_request_equals_hf_greedy(model_dir: pathlib.Path, make_executor: MakeExecutor,
                                      kernel_path: str) -> None:
    prompt = [5, 17, 99, 42, 8, 64, 3]
    executor = make_executor(model_dir)
    expected = hf_greedy(model_dir, prompt, 24)
    request_id = executor.enqueue_request(Request(prompt, 24))
    (response,) = executor.await_responses(request_id, timeout=30)
    assert response.result is not None
    assert response.result.output_token_ids == [prompt + expected]
    assert response.result.finish_reasons == [FinishReason.LENGTH]


def test_end_id_stops_like_hf_eos(model_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    prompt = [9, 33, 71, 2, 100]
    free_run = hf_greedy(model_dir, prompt, 20)
    end_id = free_run[6]  # a token the model produces; HF stops at its first occurrence
    expected = hf_greedy(model_dir, prompt, 20, end_id=end_id)
    assert len(expected) < 20
    executor = make_executor(model_dir)
    request_id = executor.enqueue_request(Request(prompt, 20, end_id=end_id))
    (response,) = executor.await_responses(request_id, timeout=30)
    assert response.result is not None
    assert response.result.output_token_ids == [prompt + expected]
    assert response.result.finish_reasons == [FinishReason.END_ID]


def test_sixteen_staggered_requests_equal_hf(model_dir: pathlib.Path,
                                             make_executor: MakeExecutor,
                                             kernel_path: str) -> None:
    rng = random.Random(16)
    cases = [(random_prompt(rng, 1, 40), rng.randrange(1, 31)) for _ in range(16)]
    executor = make_executor(model_dir, ExecutorConfig(max_batch_size=8))
    ids = []
    for index, (prompt, max_tokens) in enumerate(cases):
        ids.append(executor.enqueue_request(Request(prompt, max_tokens,
                                                    streaming=index % 2 == 1)))
        time.sleep(0.003)
    got = collect(executor, ids)
    for index, (request_id, (prompt, max_tokens)) in enumerate(zip(ids, cases, strict=True)):
        expected = hf_greedy(model_dir, prompt, max_tokens)
        results = [r.result for r in got[request_id] if r.result is not None]
        tokens = [t for result in results for t in result.output_token_ids[0]]
        streaming = index % 2 == 1
        assert tokens == (expected if streaming else prompt + expected)
        assert len(results) == (len(expected) if streaming else 1)
    stats = executor.get_latest_iteration_stats()
    mixed = [s for s in stats if s.inflight_batching_stats.num_context_requests
             and s.inflight_batching_stats.num_gen_requests]
    assert mixed, "no iteration ran context and generation phases together"
    assert max(s.inflight_batching_stats.num_scheduled_requests for s in stats) > 1


def test_kv_block_pressure_pauses_and_resumes_without_changing_outputs(
        model_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    rng = random.Random(7)
    cases = [(random_prompt(rng, 8, 20), rng.randrange(20, 31)) for _ in range(12)]
    config = ExecutorConfig(
        max_batch_size=12,
        kv_cache_config=KvCacheConfig(tokens_per_block=4, num_blocks=26),
        scheduler_config=SchedulerConfig(CapacitySchedulerPolicy.MAX_UTILIZATION))
    executor = make_executor(model_dir, config)
    ids = executor.enqueue_requests([Request(p, n) for p, n in cases])
    outputs = final_tokens(executor, ids)
    for request_id, (prompt, max_tokens) in zip(ids, cases, strict=True):
        assert outputs[request_id] == prompt + hf_greedy(model_dir, prompt, max_tokens)
    stats = executor.get_latest_iteration_stats()
    assert sum(s.inflight_batching_stats.num_paused_requests for s in stats) > 0
    assert stats[-1].kv_cache_stats.free_num_blocks == 26


BEAM_CASES = [  # (beam width, length penalty, early stopping)
    (2, 1.0, 1), (3, 0.0, 0), (2, 2.0, -1), (3, -0.5, 1), (4, 1.0, 0), (2, 0.5, -1),
]


def test_beam_search_equals_hf(model_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    """All cases enqueued at once: different widths also exercise the drain-then-switch rule."""
    rng = random.Random(3)
    cases = []
    for width, length_penalty, early_stopping in BEAM_CASES:
        for _ in range(2):
            prompt = random_prompt(rng, 2, 12)
            max_tokens = rng.randrange(6, 16)
            free_run = hf_beams(model_dir, prompt, max_tokens, beams=width, returned=1,
                                length_penalty=length_penalty, early_stopping=early_stopping,
                                end_id=None)[0]
            end_id = free_run[rng.randrange(1, 4)]  # likely enough to end some beams
            cases.append((prompt, max_tokens, width, length_penalty, early_stopping, end_id))
    executor = make_executor(model_dir, ExecutorConfig(max_beam_width=4, max_batch_size=4))
    ids = executor.enqueue_requests([
        Request(prompt, max_tokens, end_id=end_id,
                sampling_config=SamplingConfig(width, length_penalty=lp, early_stopping=es,
                                               num_return_sequences=width),
                output_config=OutputConfig(exclude_input_from_output=True))
        for prompt, max_tokens, width, lp, es, end_id in cases])
    got = collect(executor, ids)
    reasons = set()
    for request_id, (prompt, max_tokens, width, lp, es, end_id) in zip(ids, cases, strict=True):
        (response,) = got[request_id]
        assert response.result is not None and response.result.sequence_index == 0
        expected = hf_beams(model_dir, prompt, max_tokens, beams=width, returned=width,
                            length_penalty=lp, early_stopping=es, end_id=end_id)
        assert response.result.output_token_ids == expected, (width, lp, es)
        reasons.update(response.result.finish_reasons)
    assert {FinishReason.END_ID, FinishReason.LENGTH} <= reasons


def test_seeded_sampling_does_not_depend_on_the_batch(model_dir: pathlib.Path,
                                                      make_executor: MakeExecutor) -> None:
    sampled = Request([4, 8, 15, 16, 23, 42], 20,
                      sampling_config=SamplingConfig(top_k=40, temperature=0.9, seed=5))
    executor = make_executor(model_dir, ExecutorConfig(max_batch_size=16))
    alone = final_tokens(executor, [executor.enqueue_request(sampled)])
    rng = random.Random(9)
    others = [Request(random_prompt(rng, 1, 30), rng.randrange(5, 25),
                      sampling_config=SamplingConfig(top_p=0.8, seed=i)) for i in range(8)]
    ids = executor.enqueue_requests([*others[:4], sampled, *others[4:]])
    crowded = final_tokens(executor, ids)
    assert crowded[ids[4]] == next(iter(alone.values()))
    reseeded = Request([4, 8, 15, 16, 23, 42], 20,
                       sampling_config=SamplingConfig(top_k=40, temperature=0.9, seed=6))
    other_seed = final_tokens(executor, [executor.enqueue_request(reseeded)])
    assert next(iter(other_seed.values())) != next(iter(alone.values()))


@pytest.mark.parametrize("policy", list(CapacitySchedulerPolicy))
def test_beams_under_kv_pressure_equal_hf(llama_dir: pathlib.Path, make_executor: MakeExecutor,
                                          policy: CapacitySchedulerPolicy) -> None:
    rng = random.Random(11)
    cases = [(random_prompt(rng, 4, 10), rng.randrange(10, 16)) for _ in range(6)]
    config = ExecutorConfig(max_beam_width=3, max_batch_size=6,
                            kv_cache_config=KvCacheConfig(tokens_per_block=4, num_blocks=24),
                            scheduler_config=SchedulerConfig(policy))
    executor = make_executor(llama_dir, config)
    ids = executor.enqueue_requests([
        Request(p, n, sampling_config=SamplingConfig(3, length_penalty=1.0,
                                                     num_return_sequences=3),
                output_config=OutputConfig(exclude_input_from_output=True))
        for p, n in cases])
    got = collect(executor, ids)
    for request_id, (prompt, max_tokens) in zip(ids, cases, strict=True):
        result = got[request_id][-1].result
        assert result is not None
        assert result.output_token_ids == hf_beams(llama_dir, prompt, max_tokens, beams=3,
                                                   returned=3, length_penalty=1.0,
                                                   early_stopping=1, end_id=None)
    stats = executor.get_latest_iteration_stats()
    paused = sum(s.inflight_batching_stats.num_paused_requests for s in stats)
    if policy is CapacitySchedulerPolicy.MAX_UTILIZATION:
        assert paused > 0
    else:
        assert paused == 0
    assert stats[-1].kv_cache_stats.free_num_blocks == 24


def test_min_tokens_and_repetition_penalty_equal_hf(model_dir: pathlib.Path,
                                                    make_executor: MakeExecutor) -> None:
    prompt = [11, 22, 33, 44, 55]
    end_id = hf_greedy(model_dir, prompt, 10)[1]
    with torch.inference_mode():
        out = hf_model(model_dir).generate(
            torch.tensor([prompt]), max_new_tokens=20, do_sample=False, pad_token_id=0,
            eos_token_id=end_id, min_new_tokens=6, repetition_penalty=1.3)
    expected = out[0, len(prompt):].tolist()
    if end_id in expected:
        expected = expected[:expected.index(end_id)]
    executor = make_executor(model_dir)
    request_id = executor.enqueue_request(Request(
        prompt, 20, end_id=end_id,
        sampling_config=SamplingConfig(min_tokens=6, repetition_penalty=1.3),
        output_config=OutputConfig(exclude_input_from_output=True)))
    (response,) = executor.await_responses(request_id, timeout=30)
    assert response.result is not None
    assert response.result.output_token_ids == [expected]
    assert len(expected) >= 6
