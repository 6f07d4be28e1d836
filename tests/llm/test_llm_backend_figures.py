"""The llm backend's executor figures (``workers/backends/llm/figures.py``): which tokens a
result adds under each output convention, and the TTFT / inter-token observations they give."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from shoal.llm import FinishReason, OutputConfig, Request, Result, SamplingConfig
from shoal.workers.backends.llm.figures import LlmFigures, RequestClock, new_tokens


def result(tokens: list[int], final: bool = False,
           reason: FinishReason = FinishReason.NOT_FINISHED, index: int = 0) -> Result:
    return Result(is_final=final, output_token_ids=[tokens], finish_reasons=[reason],
                  sequence_index=index)


def clock() -> RequestClock:
    return RequestClock(accepted_at=0.0, prompt_tokens=3)


def fake_executor() -> Any:
    blocks = SimpleNamespace(num_blocks=8, free_blocks=8, tokens_per_block=4)
    return SimpleNamespace(config=SimpleNamespace(max_batch_size=4, device="cpu"),
                           blocks=blocks, kv=SimpleNamespace(nbytes=1024), model=object(),
                           get_latest_iteration_stats=list)


def test_streaming_results_hold_new_tokens_and_the_end_token_counts() -> None:
    request = Request([1, 2, 3], 8, streaming=True)
    c = clock()
    c.produce(request, result([5]))
    c.produce(request, result([6, 7]))
    c.produce(request, result([], final=True, reason=FinishReason.END_ID))
    assert c.produced == {0: 4} and c.unsent == 4


def test_non_streaming_results_hold_the_prompt_unless_excluded() -> None:
    whole = Request([1, 2, 3], 8)
    assert new_tokens(whole, result([1, 2, 3, 9, 9], final=True,
                                    reason=FinishReason.LENGTH), clock()) == 2
    excluded = Request([1, 2, 3], 8, output_config=OutputConfig(exclude_input_from_output=True))
    assert new_tokens(excluded, result([9, 9], final=True, reason=FinishReason.LENGTH),
                      clock()) == 2


def test_cumulative_streaming_counts_only_what_is_new() -> None:
    beams = Request([1], 8, streaming=True, sampling_config=SamplingConfig(beam_width=2))
    c = clock()
    c.produce(beams, result([4, 5]))
    c.produce(beams, result([4, 6, 7]))  # a beam changed its earlier tokens: 3 so far
    assert c.produced == {0: 3}


def test_every_token_after_the_first_is_one_inter_token_observation() -> None:
    figures = LlmFigures(fake_executor())
    request = Request([1, 2, 3], 8, streaming=True)
    a = figures.accepted(3)
    for tokens in ([5], [6], [7, 8]):  # the last response carries a held-back token too
        a.produce(request, result(tokens))
        figures.tokens_sent(a)
    figures.finished(a)
    b = figures.accepted(2)  # one response with all of its 3 tokens (non-streaming)
    b.produce(Request([1, 2], 3), result([1, 2, 9, 9, 9], final=True,
                                          reason=FinishReason.LENGTH))
    figures.tokens_sent(b)
    figures.finished(b)
    stats = figures.snapshot()
    assert (stats.prompt_tokens, stats.generation_tokens) == (5, 7)
    assert sum(stats.time_to_first_token) == 2  # one per request
    assert sum(stats.inter_token) == 7 - 2  # generated tokens minus requests
    assert stats.requests_finished == 2 and stats.finished_generation_tokens == 7
    assert sum(stats.input_token_len) == 2 and sum(stats.output_token_len) == 2


def test_a_request_that_sent_nothing_observes_no_latency() -> None:
    figures = LlmFigures(fake_executor())
    c = figures.accepted(4)
    figures.tokens_sent(c)  # a cancelled request: its final response carries no token
    figures.finished(c)
    stats = figures.snapshot()
    assert stats.time_to_first_token == [] and stats.requests_finished == 1
