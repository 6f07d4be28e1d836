"""Executor API semantics: cancellation, stop / bad words, returned sequences, streaming,
statistics, bad requests, awaiting, shutdown."""

from __future__ import annotations

import datetime
import pathlib
import time
from collections.abc import Callable

import pytest
import torch

from shoal.errors import ErrorCode, ShoalError
from shoal.llm import (
    Executor,
    ExecutorConfig,
    FinishReason,
    KvCacheConfig,
    OutputConfig,
    Request,
    RequestStage,
    Result,
    SamplingConfig,
)
from shoal.workers.workspace import WorkspacePool
from tests.llm.conftest import collect, hf_beams, hf_greedy, hf_model

MakeExecutor = Callable[..., Executor]
PROMPT = [7, 21, 88, 4, 56, 13]


def results_of(executor: Executor, request_id: int) -> list[Result]:
    responses = collect(executor, [request_id])[request_id]
    assert all(not r.has_error() for r in responses), responses
    return [r.result for r in responses if r.result is not None]


def test_cancel_ends_with_a_final_cancelled_result_and_frees_blocks(
        llama_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    executor = make_executor(llama_dir, ExecutorConfig(
        kv_cache_config=KvCacheConfig(tokens_per_block=8, num_blocks=64)))
    request_id = executor.enqueue_request(Request(PROMPT, 240, streaming=True))
    first = executor.await_responses(request_id, timeout=30)
    assert first and first[0].result is not None and not first[0].result.is_final
    executor.cancel_request(request_id)
    rest = results_of(executor, request_id)
    final = rest[-1]
    assert final.is_final and final.finish_reasons == [FinishReason.CANCELLED]
    assert all(not r.is_final for r in rest[:-1])
    generated = sum(len(r.output_token_ids[0]) for r in [first[0].result, *rest])
    assert generated < 240
    assert executor.blocks.free_blocks == 64


def test_cancel_of_a_queued_request(llama_dir: pathlib.Path,
                                    make_executor: MakeExecutor) -> None:
    executor = make_executor(llama_dir, ExecutorConfig(max_batch_size=1))
    running, queued = executor.enqueue_requests([Request(PROMPT, 200), Request([3, 4], 5)])
    executor.cancel_request(queued)
    (result,) = results_of(executor, queued)
    assert result.is_final and result.finish_reasons == [FinishReason.CANCELLED]
    assert result.output_token_ids == [[3, 4]]  # nothing generated; input included
    executor.cancel_request(running)
    assert results_of(executor, running)[-1].finish_reasons == [FinishReason.CANCELLED]
    executor.cancel_request(running)  # already ended: ignored
    assert executor.await_responses(running, timeout=0.05)[0].has_error()


def test_stop_words_end_generation(model_dir: pathlib.Path,
                                   make_executor: MakeExecutor) -> None:
    free_run = hf_greedy(model_dir, PROMPT, 20)
    stop = free_run[4:6]
    end = next(i for i in range(2, 21) if free_run[i - 2:i] == stop)
    executor = make_executor(model_dir)
    request_id = executor.enqueue_request(Request(PROMPT, 20, stop_words=[[127, 126, 125], stop]))
    (result,) = results_of(executor, request_id)
    assert result.finish_reasons == [FinishReason.STOP_WORDS]
    assert result.output_token_ids == [PROMPT + free_run[:end]]


def test_bad_words_never_appear(model_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    free_run = hf_greedy(model_dir, PROMPT, 30)
    banned_token = max(set(free_run), key=free_run.count)
    pair = next(free_run[i:i + 2] for i in range(len(free_run) - 1)
                if banned_token not in free_run[i:i + 2])
    bad_words = [[banned_token], pair]
    executor = make_executor(model_dir, ExecutorConfig(max_beam_width=2))
    greedy = Request(PROMPT, 30, bad_words=bad_words)
    sampled = Request(PROMPT, 30, bad_words=bad_words,
                      sampling_config=SamplingConfig(top_k=128, seed=3, num_return_sequences=4))
    beams = Request(PROMPT, 30, bad_words=bad_words, end_id=None,
                    sampling_config=SamplingConfig(2, num_return_sequences=2),
                    output_config=OutputConfig(exclude_input_from_output=True))
    ids = executor.enqueue_requests([greedy, sampled])
    ids.append(executor.enqueue_request(beams))
    outputs: list[list[int]] = []
    for request_id, responses in collect(executor, ids).items():
        for response in responses:
            assert response.result is not None
            outputs += [tokens[len(PROMPT):] if request_id != ids[2] else tokens
                        for tokens in response.result.output_token_ids]
    assert len(outputs) == 1 + 4 + 2
    for generated in outputs:
        assert len(generated) == 30 and banned_token not in generated
        assert all(generated[i:i + 2] != pair for i in range(len(generated) - 1))


def test_returned_sequences_with_sampling_stream_interleaved(
        llama_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    executor = make_executor(llama_dir)
    sampling = SamplingConfig(top_k=128, temperature=1.5, seed=11, num_return_sequences=3)
    request_id = executor.enqueue_request(Request(PROMPT, 8, streaming=True,
                                                  sampling_config=sampling))
    results = results_of(executor, request_id)
    assert len(results) == 24 and all(len(r.output_token_ids[0]) == 1 for r in results)
    assert [r.is_final for r in results] == [False] * 23 + [True]
    by_index: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for result in results:
        by_index[result.sequence_index] += result.output_token_ids[0]
        assert result.is_sequence_final == (len(by_index[result.sequence_index]) == 8)
    assert len({tuple(tokens) for tokens in by_index.values()}) > 1
    # sequence 0 draws from the request's seed, exactly like a one-sequence request
    single = executor.enqueue_request(Request(
        PROMPT, 8, sampling_config=SamplingConfig(top_k=128, temperature=1.5, seed=11),
        output_config=OutputConfig(exclude_input_from_output=True)))
    assert results_of(executor, single)[-1].output_token_ids == [by_index[0]]


def test_returned_sequences_with_sampling_not_streaming(
        llama_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    executor = make_executor(llama_dir)
    request_id = executor.enqueue_request(Request(
        PROMPT, 6, sampling_config=SamplingConfig(top_p=0.9, seed=2), num_return_sequences=3))
    results = results_of(executor, request_id)
    assert sorted(r.sequence_index for r in results) == [0, 1, 2]
    assert all(r.is_sequence_final for r in results)
    assert [r.is_final for r in results] == [False, False, True]
    assert all(r.output_token_ids[0][:len(PROMPT)] == PROMPT for r in results)


def test_returned_sequences_with_beams(llama_dir: pathlib.Path,
                                       make_executor: MakeExecutor) -> None:
    executor = make_executor(llama_dir, ExecutorConfig(max_beam_width=3))
    sampling = SamplingConfig(3, length_penalty=1.0, num_return_sequences=2)
    request_id = executor.enqueue_request(Request(PROMPT, 10, sampling_config=sampling))
    (result,) = results_of(executor, request_id)
    assert result.is_final and result.is_sequence_final and result.sequence_index == 0
    expected = hf_beams(llama_dir, PROMPT, 10, beams=3, returned=2, length_penalty=1.0,
                        early_stopping=1, end_id=None)
    assert result.output_token_ids == [PROMPT + beam for beam in expected]


def test_streaming_beams_report_running_beams_then_the_final_ones(
        llama_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    executor = make_executor(llama_dir, ExecutorConfig(max_beam_width=2))
    request_id = executor.enqueue_request(Request(
        PROMPT, 6, streaming=True, sampling_config=SamplingConfig(2, num_return_sequences=2)))
    results = results_of(executor, request_id)
    assert [r.is_final for r in results] == [False] * (len(results) - 1) + [True]
    assert [len(r.output_token_ids[0]) for r in results[:-1]] == list(range(1, len(results)))
    expected = hf_beams(llama_dir, PROMPT, 6, beams=2, returned=2, length_penalty=0.0,
                        early_stopping=1, end_id=None)
    assert results[-1].output_token_ids == expected


def test_streaming_delivers_each_token_when_its_iteration_completes(
        gpt2_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    executor = make_executor(gpt2_dir)
    request_id = executor.enqueue_request(Request(PROMPT, 150, streaming=True))
    first_batch = executor.await_responses(request_id, timeout=30)
    first_results = [r.result for r in first_batch if r.result is not None]
    assert first_results and not any(r.is_final for r in first_results)
    results = first_results + results_of(executor, request_id)
    assert [r.decoding_iter for r in results] == list(range(1, 151))
    tokens = [t for r in results for t in r.output_token_ids[0]]
    assert tokens == hf_greedy(gpt2_dir, PROMPT, 150)


def test_iteration_and_request_statistics(llama_dir: pathlib.Path,
                                          make_executor: MakeExecutor) -> None:
    config = ExecutorConfig(kv_cache_config=KvCacheConfig(tokens_per_block=4, num_blocks=50),
                            request_stats_max_iterations=100)
    executor = make_executor(llama_dir, config)
    prompts = [[5] * 3, [6] * 9, [7] * 5]
    ids = executor.enqueue_requests([Request(p, n) for p, n in zip(prompts, (4, 6, 8),
                                                                    strict=True)])
    collect(executor, ids)
    stats = executor.get_latest_iteration_stats()
    assert [s.iter for s in stats] == list(range(1, len(stats) + 1))
    first = stats[0]
    assert first.num_active_requests == 3 and first.num_new_active_requests == 3
    assert first.inflight_batching_stats.num_context_requests == 3
    assert first.inflight_batching_stats.num_ctx_tokens == 17
    assert stats[1].inflight_batching_stats.num_gen_tokens == 3
    assert stats[1].inflight_batching_stats.num_gen_requests == 3
    for s in stats:
        kv = s.kv_cache_stats
        assert kv.used_num_blocks + kv.free_num_blocks == kv.max_num_blocks == 50
    assert stats[0].kv_cache_stats.used_num_blocks == 1 + 3 + 2
    assert stats[-1].kv_cache_stats.free_num_blocks == 50
    assert sum(s.num_completed_requests for s in stats) == 3
    assert executor.get_latest_iteration_stats() == []  # handed out once
    stages = [next(r.stage for r in it.request_stats if r.id == ids[2])
              for it in executor.get_latest_request_stats()
              if any(r.id == ids[2] for r in it.request_stats)]
    assert stages[0] is RequestStage.CONTEXT_IN_PROGRESS
    assert stages[-1] is RequestStage.GENERATION_COMPLETE
    assert set(stages[1:-1]) == {RequestStage.GENERATION_IN_PROGRESS}


@pytest.mark.parametrize(("bad", "message"), [
    (Request([], 5), "input_token_ids must not be empty"),
    (Request([1, 2], 0), "max_tokens must be an integer >= 1"),
    (Request([1, 2], 5, sampling_config=SamplingConfig(3)), "beam_width 3 exceeds"),
    (Request([1, 500], 5), "input_token_ids[1] = 500 is not a token id"),
    (Request([-1], 5), "input_token_ids[0] = -1"),
    (Request([1], 5, stop_words=[[]]), "stop_words[0] must not be empty"),
    (Request([1], 5, bad_words=[[1, 999]]), "bad_words[0][1] = 999"),
    (Request([1], 5, end_id=128), "end_id = 128"),
    (Request([1], 300), "exceeds the maximum sequence length 256"),
    (Request([1], 5, sampling_config=SamplingConfig(top_p=1.5)), "sampling_config.top_p"),
    (Request([1], 5, num_return_sequences=0), "num_return_sequences must be >= 1"),
])
def test_bad_requests_fail_clearly_without_disturbing_others(
        llama_dir: pathlib.Path, make_executor: MakeExecutor, bad: Request,
        message: str) -> None:
    executor = make_executor(llama_dir, ExecutorConfig(max_beam_width=2))
    good_id, bad_id = executor.enqueue_requests([Request(PROMPT, 12), bad])
    got = collect(executor, [good_id, bad_id])
    (error,) = got[bad_id]
    assert error.has_error() and message in (error.error_msg or "")
    assert error.result is None
    (good,) = got[good_id]
    assert good.result is not None
    assert good.result.output_token_ids == [PROMPT + hf_greedy(llama_dir, PROMPT, 12)]


def test_request_larger_than_the_kv_cache_is_refused(llama_dir: pathlib.Path,
                                                     make_executor: MakeExecutor) -> None:
    executor = make_executor(llama_dir, ExecutorConfig(
        kv_cache_config=KvCacheConfig(tokens_per_block=4, num_blocks=5)))
    (response,) = executor.await_responses(executor.enqueue_request(Request([1] * 10, 20)),
                                           timeout=5)
    assert "needs up to 8 KV cache blocks" in (response.error_msg or "")


def test_await_unknown_terminated_and_timeouts(llama_dir: pathlib.Path,
                                               make_executor: MakeExecutor) -> None:
    executor = make_executor(llama_dir)
    (unknown,) = executor.await_responses(999, timeout=1)
    assert "not a known request id" in (unknown.error_msg or "")
    started = time.monotonic()
    assert executor.await_responses(timeout=datetime.timedelta(milliseconds=50)) == []
    assert time.monotonic() - started >= 0.04
    request_id = executor.enqueue_request(Request(PROMPT, 3, client_id=77))
    (done,) = executor.await_responses(request_id, timeout=30)
    assert done.client_id == 77 and done.result is not None and done.result.is_final
    (again,) = executor.await_responses(request_id, timeout=1)
    assert "already been processed" in (again.error_msg or "")
    a, b = executor.enqueue_requests([Request(PROMPT, 2), Request(PROMPT, 3)])
    deadline = time.monotonic() + 30
    while executor.get_num_responses_ready() < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert executor.get_num_responses_ready(a) == 1 and executor.get_num_responses_ready(b) == 1
    per_id = executor.await_responses([a, b], timeout=30)
    assert [len(responses) for responses in per_id] == [1, 1]
    assert [responses[0].request_id for responses in per_id] == [a, b]
    assert executor.get_num_responses_ready() == 0


@pytest.mark.usefixtures("one_torch_thread")
def test_log_probs_and_logits_match_hf(model_dir: pathlib.Path,
                                       make_executor: MakeExecutor) -> None:
    executor = make_executor(model_dir)
    output = OutputConfig(return_log_probs=True, return_context_logits=True,
                          return_generation_logits=True, exclude_input_from_output=True)
    request_id = executor.enqueue_request(Request(PROMPT, 8, output_config=output))
    (result,) = results_of(executor, request_id)
    model = hf_model(model_dir)
    with torch.inference_mode():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False,
                             pad_token_id=0, eos_token_id=None, return_dict_in_generate=True,
                             output_logits=True)
        context = model(torch.tensor([PROMPT])).logits[0]
    logits = torch.stack(out.logits)[:, 0]
    assert result.context_logits is not None and result.generation_logits is not None
    assert result.log_probs is not None and result.cum_log_probs is not None
    assert result.output_token_ids == [out.sequences[0, len(PROMPT):].tolist()]
    assert torch.allclose(result.context_logits, context, atol=1e-5)
    assert torch.allclose(result.generation_logits, logits, atol=1e-4)
    expected = torch.log_softmax(logits, -1).gather(1, out.sequences[0, len(PROMPT):, None])
    assert result.log_probs[0] == pytest.approx(expected[:, 0].tolist(), abs=1e-4)
    assert result.cum_log_probs[0] == pytest.approx(sum(result.log_probs[0]), abs=1e-4)


def test_shutdown_ends_live_requests_and_refuses_new_ones(llama_dir: pathlib.Path) -> None:
    executor = Executor(llama_dir, ExecutorConfig(max_batch_size=1))
    ids = executor.enqueue_requests([Request(PROMPT, 240), Request(PROMPT, 240)])
    executor.shutdown()
    got = {i: executor.await_responses(i, timeout=1) for i in ids}
    assert got[ids[1]][-1].has_error() and "shut down" in (got[ids[1]][-1].error_msg or "")
    with pytest.raises(ShoalError) as raised:
        executor.enqueue_request(Request(PROMPT, 2))
    assert raised.value.code is ErrorCode.UNAVAILABLE
    assert not executor.can_enqueue_requests()


def test_max_queue_size_refuses_what_would_overfill_the_queue(llama_dir: pathlib.Path) -> None:
    """TensorRT-LLM's maxQueueSize (the tensorrt_llm model's dynamic_batching max_queue_size):
    requests waiting to be admitted are bounded; an enqueue that would pass the bound is
    refused whole (UNAVAILABLE, TRT-LLM's message) and the queue drains as before."""
    executor = Executor(llama_dir, ExecutorConfig(max_batch_size=1, max_queue_size=2))
    try:
        with pytest.raises(ShoalError) as raised:
            executor.enqueue_requests([Request(PROMPT, 2)] * 3)
        assert raised.value.code is ErrorCode.UNAVAILABLE
        assert raised.value.message == ("Maximum queue size of 2 has been reached, please try "
                                        "again later")
        ids = executor.enqueue_requests([Request(PROMPT, 2)] * 2)
        for responses in collect(executor, ids).values():
            final = responses[-1].result
            assert final is not None and final.is_final
    finally:
        executor.shutdown()


def test_tokenizer_and_workspace(llama_dir: pathlib.Path) -> None:
    workspace = WorkspacePool("cpu", 1 << 20)
    config = ExecutorConfig(kv_cache_config=KvCacheConfig(tokens_per_block=16, num_blocks=16))
    with Executor(llama_dir, config, workspace=workspace) as executor:
        assert executor.tokenizer is not None
        assert executor.tokenizer.encode("w5 w6 w127").ids == [5, 6, 127]
        assert workspace.used_bytes >= executor.kv.nbytes > 0
        assert workspace.fallback_allocations == 0


def test_numpy_token_ids_are_accepted(llama_dir: pathlib.Path,
                                      make_executor: MakeExecutor) -> None:
    import numpy as np

    executor = make_executor(llama_dir)
    request_id = executor.enqueue_request(Request(list(np.array(PROMPT, dtype=np.int64)), 4))
    (result,) = results_of(executor, request_id)
    assert result.output_token_ids == [PROMPT + hf_greedy(llama_dir, PROMPT, 4)]
    assert all(type(token) is int for token in result.output_token_ids[0])


def test_returned_sequences_share_the_prompt_blocks(llama_dir: pathlib.Path,
                                                   make_executor: MakeExecutor) -> None:
    executor = make_executor(llama_dir, ExecutorConfig(
        kv_cache_config=KvCacheConfig(tokens_per_block=4, num_blocks=40)))
    request_id = executor.enqueue_request(Request(
        list(range(3, 19)), 3, sampling_config=SamplingConfig(top_k=20, num_return_sequences=4)))
    assert len(results_of(executor, request_id)) == 4
    used = [s.kv_cache_stats.used_num_blocks for s in executor.get_latest_iteration_stats()]
    # 16 prompt tokens = 4 shared blocks; each sequence then writes its own 5th block
    assert used[:2] == [4, 4 + 4]
    assert used[-1] == 0


def test_iteration_hook_delivers_on_the_loop_thread(llama_dir: pathlib.Path,
                                                    make_executor: MakeExecutor) -> None:
    """What the llm backend relies on: the hook runs on the executor's thread after each pass,
    takes every response with await_responses(timeout=0) (tokens in order, the final last),
    also runs for a response that needs no iteration (a refused request) and survives raising."""
    import threading

    executor = make_executor(llama_dir)
    taken: list[tuple[str, int, bool]] = []
    failures = {"left": 1}

    def hook() -> None:
        for response in executor.await_responses(timeout=0):
            final = response.has_error() or (response.result is not None
                                            and response.result.is_final)
            taken.append((threading.current_thread().name, response.request_id, final))
        if failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("a hook that fails once")

    executor.set_iteration_hook(hook)
    good = executor.enqueue_request(Request(PROMPT, 6, streaming=True))
    deadline = time.monotonic() + 30
    while not any(rid == good and final for _, rid, final in taken):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    refused = executor.enqueue_request(Request([], 5))  # answered without an iteration
    while not any(rid == refused for _, rid, _ in taken):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    mine = [entry for entry in taken if entry[1] == good]
    assert len(mine) == 6 and [final for _, _, final in mine] == [False] * 5 + [True]
    assert {name for name, _, _ in taken} == {"llm-executor"}
    executor.set_iteration_hook(None)
    assert executor.await_responses(timeout=0) == []  # the hook took everything
