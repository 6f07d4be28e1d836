"""Logits post-processors (TensorRT-LLM's ``LogitsPostProcessorConfig``) and the top log-prob
alternatives of ``OutputConfig.num_top_log_probs``, on the in-process executor."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import torch

from shoal.llm import (
    Executor,
    ExecutorConfig,
    LogitsPostProcessorConfig,
    OutputConfig,
    Request,
    Result,
    SamplingConfig,
)
from tests.llm.conftest import collect, hf_greedy, hf_model

MakeExecutor = Callable[..., Executor]
PROMPT = [7, 21, 88, 4, 56, 13]
OTHER = [3, 9, 27, 81]


def tokens_of(executor: Executor, request_id: int) -> list[int]:
    responses = collect(executor, [request_id])[request_id]
    assert all(not r.has_error() for r in responses), responses
    final = responses[-1].result
    assert final is not None and final.is_final
    return final.output_token_ids[0][len(PROMPT):]


def final_result(executor: Executor, request_id: int) -> Result:
    responses = collect(executor, [request_id])[request_id]
    assert all(not r.has_error() for r in responses), responses
    result = responses[-1].result
    assert result is not None
    return result


def with_processors(make: MakeExecutor, path: pathlib.Path, **config: Any) -> Executor:
    return make(path, ExecutorConfig(
        logits_post_processor_config=LogitsPostProcessorConfig(**config)))


def test_a_processor_that_bans_a_token_is_obeyed(llama_dir: pathlib.Path,
                                                  make_executor: MakeExecutor) -> None:
    free = hf_greedy(llama_dir, PROMPT, 12)
    banned = free[0]

    def ban(req_id: int, logits: torch.Tensor, ids: list[list[int]], stream: int,
            client_id: int | None) -> None:
        logits[:, banned] = float("-inf")

    executor = with_processors(make_executor, llama_dir, processor_map={"ban": ban})
    assert tokens_of(executor, executor.enqueue_request(Request(PROMPT, 12))) == free
    processed = tokens_of(executor, executor.enqueue_request(
        Request(PROMPT, 12, logits_post_processor_name="ban")))
    assert banned not in processed
    assert processed[0] != free[0]


def test_the_processor_gets_request_id_rows_tokens_so_far_and_client_id(
        llama_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    calls: list[tuple[int, list[int], list[list[int]], int, int | None]] = []

    def record(req_id: int, logits: torch.Tensor, ids: list[list[int]], stream: int,
               client_id: int | None) -> None:
        calls.append((req_id, list(logits.shape), [list(i) for i in ids], stream, client_id))

    executor = with_processors(make_executor, llama_dir, processor_map={"record": record})
    request_id = executor.enqueue_request(
        Request(PROMPT, 3, client_id=77, logits_post_processor_name="record"))
    generated = tokens_of(executor, request_id)
    vocab = executor.model.spec.vocab_size
    assert [c[0] for c in calls] == [request_id] * 3
    assert all(c[1] == [1, vocab] and c[3] == 0 and c[4] == 77 for c in calls)
    assert [c[2] for c in calls] == [[PROMPT + generated[:i]] for i in range(3)]


def test_a_processor_may_return_the_changed_logits(llama_dir: pathlib.Path,
                                                   make_executor: MakeExecutor) -> None:
    def force_five(req_id: int, logits: torch.Tensor, ids: list[list[int]], stream: int,
                   client_id: int | None) -> torch.Tensor:
        forced = torch.full_like(logits, float("-inf"))
        forced[:, 5] = 0.0
        return forced

    executor = with_processors(make_executor, llama_dir, processor_map={"five": force_five})
    assert tokens_of(executor, executor.enqueue_request(
        Request(PROMPT, 4, logits_post_processor_name="five"))) == [5, 5, 5, 5]


def test_the_batched_processor_is_called_once_per_iteration_with_every_request(
        llama_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    calls: list[list[int]] = []

    def batched(req_ids: list[int], logits: list[torch.Tensor], ids: list[list[list[int]]],
                stream: int, client_ids: list[int | None]) -> None:
        assert len(logits) == len(ids) == len(client_ids) == len(req_ids)
        calls.append(list(req_ids))

    executor = with_processors(make_executor, llama_dir, processor_batched=batched)
    first, second = executor.enqueue_requests([
        Request(PROMPT, 5, logits_post_processor_name=Request.BATCHED_POST_PROCESSOR_NAME),
        Request(OTHER, 5, logits_post_processor_name="batched")])
    collect(executor, [first, second])
    assert calls == [[first, second]] * 5


def test_a_raising_processor_fails_only_its_request(llama_dir: pathlib.Path,
                                                    make_executor: MakeExecutor) -> None:
    def boom(req_id: int, logits: torch.Tensor, ids: list[list[int]], stream: int,
             client_id: int | None) -> None:
        if len(ids[0]) > len(PROMPT) + 1:
            raise RuntimeError("processor bug")

    executor = with_processors(make_executor, llama_dir, processor_map={"boom": boom})
    failing, healthy = executor.enqueue_requests([
        Request(PROMPT, 8, logits_post_processor_name="boom", streaming=True),
        Request(PROMPT, 8)])
    got = collect(executor, [failing, healthy])
    assert got[failing][-1].has_error()
    assert "logits post-processor 'boom' failed: RuntimeError: processor bug" in \
        (got[failing][-1].error_msg or "")
    healthy_final = got[healthy][-1].result
    assert healthy_final is not None and healthy_final.is_final
    assert healthy_final.output_token_ids[0][len(PROMPT):] == hf_greedy(llama_dir, PROMPT, 8)
    assert executor.blocks.free_blocks == executor.blocks.num_blocks


@pytest.mark.parametrize(("name", "config"), [
    ("nope", {"processor_map": {"a": lambda *args: None}}),
    ("batched", {"processor_map": {"a": lambda *args: None}}),
    ("a", {}),
])
def test_an_unknown_processor_name_is_refused_naming_the_field(
        llama_dir: pathlib.Path, make_executor: MakeExecutor, name: str,
        config: dict[str, Any]) -> None:
    executor = with_processors(make_executor, llama_dir, **config)
    request_id = executor.enqueue_request(Request(PROMPT, 4, logits_post_processor_name=name))
    (response,) = collect(executor, [request_id])[request_id]
    assert response.has_error()
    assert f"logits_post_processor_name '{name}' is not a logits post-processor" in \
        (response.error_msg or "")


def test_batched_is_a_reserved_processor_name() -> None:
    with pytest.raises(ValueError, match="reserved"):
        LogitsPostProcessorConfig(processor_map={"batched": lambda *args: None})


# ------------------------------------------------------------------ top log-probs


def test_greedy_top_log_probs_start_with_the_chosen_token_and_match_hugging_face(
        llama_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    executor = make_executor(llama_dir)
    result = final_result(executor, executor.enqueue_request(Request(
        PROMPT, 6, output_config=OutputConfig(return_log_probs=True, num_top_log_probs=4))))
    assert result.log_probs is not None and result.top_log_probs is not None
    generated = result.output_token_ids[0][len(PROMPT):]
    tops = result.top_log_probs[0]
    assert len(tops) == len(generated) == len(result.log_probs[0])
    for token, log_prob, top in zip(generated, result.log_probs[0], tops, strict=True):
        assert len(top) == 4
        assert top[0] == (token, pytest.approx(log_prob, abs=1e-6))
        assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
    with torch.inference_mode():
        logits = hf_model(llama_dir)(torch.tensor([PROMPT])).logits[0, -1]
    expected = torch.log_softmax(logits, dim=-1).topk(4)
    assert [t for t, _ in tops[0]] == expected.indices.tolist()
    assert [lp for _, lp in tops[0]] == pytest.approx(expected.values.tolist(), abs=1e-4)


def test_sampled_tokens_and_their_log_probs_come_from_the_alternatives(
        llama_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    executor = make_executor(llama_dir)
    result = final_result(executor, executor.enqueue_request(Request(
        PROMPT, 10, sampling_config=SamplingConfig(top_k=3, temperature=0.7, seed=5,
                                                   presence_penalty=0.5),
        output_config=OutputConfig(return_log_probs=True, num_top_log_probs=3))))
    assert result.log_probs is not None and result.top_log_probs is not None
    generated = result.output_token_ids[0][len(PROMPT):]
    for token, log_prob, top in zip(generated, result.log_probs[0], result.top_log_probs[0],
                                    strict=True):
        assert dict(top)[token] == pytest.approx(log_prob, abs=1e-6)


def test_num_top_log_probs_is_checked(llama_dir: pathlib.Path,
                                      make_executor: MakeExecutor) -> None:
    executor = make_executor(llama_dir, ExecutorConfig(max_beam_width=2))
    ids = executor.enqueue_requests([
        Request(PROMPT, 2, output_config=OutputConfig(num_top_log_probs=-1)),
        Request(PROMPT, 2, sampling_config=SamplingConfig(2),
                output_config=OutputConfig(num_top_log_probs=2))])
    got = collect(executor, ids)
    assert "num_top_log_probs must be an integer in 0.." in (got[ids[0]][0].error_msg or "")
    assert "num_top_log_probs needs beam_width 1" in (got[ids[1]][0].error_msg or "")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_processors_and_top_log_probs_on_cuda(llama_dir: pathlib.Path,
                                              make_executor: MakeExecutor) -> None:
    seen: list[tuple[str, int]] = []
    free = hf_greedy(llama_dir, PROMPT, 6)

    def ban(req_id: int, logits: torch.Tensor, ids: list[list[int]], stream: int,
            client_id: int | None) -> None:
        seen.append((logits.device.type, stream))
        logits[:, free[0]] = float("-inf")

    executor = make_executor(llama_dir, ExecutorConfig(
        device="cuda:0", logits_post_processor_config=LogitsPostProcessorConfig(
            processor_map={"ban": ban})))
    result = final_result(executor, executor.enqueue_request(Request(
        PROMPT, 6, logits_post_processor_name="ban",
        output_config=OutputConfig(return_log_probs=True, num_top_log_probs=3))))
    generated = result.output_token_ids[0][len(PROMPT):]
    assert free[0] not in generated
    assert result.log_probs is not None and result.top_log_probs is not None
    for token, log_prob, top in zip(generated, result.log_probs[0], result.top_log_probs[0],
                                    strict=True):
        assert top[0] == (token, pytest.approx(log_prob, abs=1e-5))
        assert free[0] not in [t for t, _ in top[:1]]
    stream = torch.cuda.current_stream(torch.device("cuda:0")).cuda_stream
    assert seen and all(d == "cuda" and s == stream for d, s in seen)
