"""BeamSearch against exhaustive search on a tiny vocabulary (synthetic, deterministic
log-probabilities; no model). With at least vocab**max_new_tokens beams the search is
exhaustive, so its best hypotheses must equal brute force exactly, including the case where the
vocabulary is smaller than 2 * beam_width (the one rule that differs from HF on purpose)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
import torch

from shoal.llm.beam_search import BeamSearch, FinishedBeam
from shoal.llm.request import FinishReason

VOCAB = 4
END = 3


def log_probs_after(prefix: list[int]) -> torch.Tensor:
    seed = hash(tuple(prefix)) % (2**31)
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 2.0
    return torch.log_softmax(logits, dim=-1)


@dataclass
class Beam:
    generated: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)


def run_search(beams: int, max_new: int, length_penalty: float,
               early_stopping: int) -> BeamSearch:
    search = BeamSearch(beam_width=beams, length_penalty=length_penalty,
                        early_stopping=early_stopping, max_new_tokens=max_new)
    running = [Beam()]
    step = 0
    while not search.done:
        scores = torch.stack([log_probs_after(b.generated) for b in running])

        def check(parent: int, token: int, step: int = step) -> FinishReason:
            if token == END:
                return FinishReason.END_ID
            return FinishReason.LENGTH if step + 1 >= max_new else FinishReason.NOT_FINISHED

        choices = search.step(scores, running, step, check)
        running = [Beam([*running[c.parent].generated, c.token],
                        [*running[c.parent].log_probs, c.token_log_prob]) for c in choices]
        step += 1
    return search


def brute_force(max_new: int, length_penalty: float) -> list[tuple[float, list[int]]]:
    """Every finished hypothesis (ends with END, or reaches max_new tokens), best first."""
    found: list[tuple[float, list[int]]] = []
    for length in range(1, max_new + 1):
        for tokens in itertools.product(range(VOCAB), repeat=length):
            if END in tokens[:-1] or (length < max_new and tokens[-1] != END):
                continue
            total = sum(float(log_probs_after(list(tokens[:i]))[t])
                        for i, t in enumerate(tokens))
            kept = list(tokens[:-1]) if tokens[-1] == END else list(tokens)
            found.append((total / length ** length_penalty, kept))
    found.sort(key=lambda item: item[0], reverse=True)
    return found


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0, -1.0])
def test_exhaustive_beam_search_equals_brute_force(length_penalty: float) -> None:
    max_new = 3
    search = run_search(VOCAB ** max_new, max_new, length_penalty, early_stopping=-1)
    expected = brute_force(max_new, length_penalty)
    best: list[FinishedBeam] = search.best(10)
    assert [b.tokens for b in best] == [tokens for _, tokens in expected[:10]]
    for beam, (score, _) in zip(best, expected, strict=False):
        assert beam.score == pytest.approx(score, rel=1e-5)
    assert any(b.reason is FinishReason.END_ID for b in best)
    assert any(b.reason is FinishReason.LENGTH for b in best)


def test_log_probs_of_a_finished_beam_add_up_to_its_score() -> None:
    search = run_search(8, 4, 0.0, early_stopping=1)
    for beam in search.best(8):
        ended = 0.0
        if beam.reason is FinishReason.END_ID:
            ended = float(log_probs_after(beam.tokens)[END])
        assert sum(beam.log_probs) + ended == pytest.approx(beam.cum_log_prob, abs=1e-4)
        assert beam.score == pytest.approx(beam.cum_log_prob, abs=1e-4)


def test_early_stopping_true_ends_once_beam_width_hypotheses_finished() -> None:
    search = run_search(2, 50, 1.0, early_stopping=1)
    assert search.done and len(search.finished) == 2
    assert all(b.reason is FinishReason.END_ID for b in search.finished)
    assert max(len(b.tokens) for b in search.finished) < 49  # stopped long before the limit
