from __future__ import annotations

import pytest
import torch

from shoal.llm.request import Request, SamplingConfig
from shoal.llm.sampling import (
    DecodingParams,
    TokenRow,
    choose_tokens,
    process_logits,
    truncate,
)


def params(**sampling: object) -> DecodingParams:
    extra = {k: sampling.pop(k) for k in ("end_id", "bad_words", "stop_words") if k in sampling}
    return DecodingParams.from_request(
        Request([1], 4, sampling_config=SamplingConfig(**sampling), **extra))  # type: ignore[arg-type]


@pytest.mark.parametrize(("config", "greedy"), [
    ({}, True), ({"top_k": 1}, True), ({"temperature": 0.0, "top_k": 5}, True),
    ({"temperature": 0.7}, True), ({"top_k": 5}, False), ({"top_p": 0.9}, False),
])
def test_greedy_follows_trt_llm_rule(config: dict[str, object], greedy: bool) -> None:
    assert params(**config).greedy is greedy


def test_repetition_penalty_matches_hugging_face() -> None:
    from transformers import RepetitionPenaltyLogitsProcessor

    logits = torch.randn(16, generator=torch.Generator().manual_seed(0))
    history = [3, 5, 5, 9]
    ours = process_logits(logits, params(repetition_penalty=1.7), history, 1)
    theirs = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([history]), logits[None].clone())
    assert torch.equal(ours, theirs[0])


def test_presence_and_frequency_penalties_count_occurrences() -> None:
    logits = torch.zeros(8)
    out = process_logits(logits, params(presence_penalty=0.5, frequency_penalty=0.25),
                         [1, 2, 2, 2], 0)
    assert out[1] == pytest.approx(-0.75) and out[2] == pytest.approx(-1.25)
    assert out[0] == 0.0


def test_bad_words_ban_the_last_token_after_their_prefix() -> None:
    logits = torch.zeros(8)
    p = params(bad_words=[[4], [6, 7]])
    out = process_logits(logits, p, [1, 6], 1)
    assert out[4] == float("-inf") and out[7] == float("-inf")
    out = process_logits(logits, p, [1, 5], 1)
    assert out[4] == float("-inf") and out[7] == 0.0


def test_min_tokens_bans_the_end_id_until_reached() -> None:
    p = params(min_tokens=3, end_id=2)
    assert process_logits(torch.zeros(4), p, [1, 1], 2)[2] == float("-inf")
    assert process_logits(torch.zeros(4), p, [1, 1, 1], 3)[2] == 0.0


def test_top_k_and_top_p_truncation() -> None:
    log_probs = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert torch.count_nonzero(truncate(log_probs, 2, 0.0)).item() == 2
    assert torch.count_nonzero(truncate(log_probs, 0, 0.7)).item() == 2  # 0.5 + 0.3 >= 0.7
    assert torch.count_nonzero(truncate(log_probs, 0, 0.5)).item() == 1
    assert torch.count_nonzero(truncate(log_probs, 0, 1.0)).item() == 4


def sample(p: DecodingParams, logits: torch.Tensor, generator: torch.Generator,
           count: int) -> list[int]:
    rows = [TokenRow(p, [1], 0, generator, False)]
    return [choose_tokens(logits[None], rows)[0][0] for _ in range(count)]


def test_seeded_sampling_is_reproducible_and_independent_of_other_rows() -> None:
    p = params(top_k=50, seed=7)
    logits = torch.randn(32, generator=torch.Generator().manual_seed(1))
    alone = sample(p, logits, p.generator(0), 20)
    assert alone == sample(p, logits, p.generator(0), 20)
    # the same generator drawn next to other rows gives the same tokens
    generator, other = p.generator(0), params(top_k=50, seed=99).generator(0)
    mixed = []
    for _ in range(20):
        rows = [TokenRow(p, [1], 0, other, False), TokenRow(p, [1], 0, generator, False)]
        mixed.append(choose_tokens(torch.stack([logits, logits]), rows)[1][0])
    assert mixed == alone
    assert sample(p, logits, p.generator(1), 20) != alone  # another sequence index differs


def test_top_k_sampling_draws_only_allowed_tokens_in_proportion() -> None:
    p = params(top_k=2, seed=3)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0]).log()
    draws = sample(p, logits, p.generator(0), 2000)
    assert set(draws) <= {0, 1}
    assert 0.6 < draws.count(0) / len(draws) < 0.73  # 2 / 3 expected


def test_greedy_log_prob_is_the_log_softmax_of_the_chosen_token() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0]])
    ((token, log_prob),) = choose_tokens(logits, [TokenRow(params(), [1], 0, None, True)])
    assert token == 1
    assert log_prob == pytest.approx(float(torch.log_softmax(logits[0], -1)[1]))
