"""Beam search of one request, step by step, with Hugging Face's rules
(``GenerationMixin._beam_search`` of transformers 5, ``do_sample=False``):

- each step ranks ``2 * beam_width`` candidates (running score + token log-probability, over all
  running beams) and keeps the best ``beam_width`` that did not finish as the running beams;
- a candidate finishes when its token is the end id, completes a stop word, or reaches
  ``max_new_tokens``; only finished candidates among the top ``beam_width`` are kept, scored
  ``sum_log_probs / generated_length ** length_penalty`` (the end token counts in the length),
  and the best ``beam_width`` finished hypotheses are retained;
- the search ends when ``early_stopping`` is 1 and ``beam_width`` hypotheses have finished,
  when no running beam can still beat the worst retained hypothesis (HF's heuristic: the best
  running score divided by the current length, or by ``max_new_tokens`` when
  ``early_stopping`` is -1 and ``length_penalty > 0``), or when every candidate finished.

Scores are float32 tensors as in HF, so ties and rounding behave the same way.

One rule differs on purpose: the first step sees the prompt once, where HF ranks
``beam_width`` copies of it scored [0, -1e9, ...]. Both give the same beams whenever the
vocabulary has at least ``2 * beam_width`` tokens (any real model). With a smaller vocabulary HF
fills the missing candidates with phantom copies scored about -1e9; here a step simply ranks
the fewer real candidates, so the search stays exact (tests compare it with brute force).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from shoal.llm.request import FinishReason

DEAD_SCORE = -1.0e9  # HF's penalty for candidates that cannot continue


class BeamHistory(Protocol):
    """What a running beam exposes to the search: its generated tokens and their log-probs."""

    @property
    def generated(self) -> list[int]: ...

    log_probs: list[float]


@dataclass(frozen=True)
class FinishedBeam:
    score: float  # sum_log_probs / generated_length ** length_penalty
    cum_log_prob: float
    tokens: list[int]  # generated tokens, without a final end id
    log_probs: list[float]  # aligned with ``tokens``
    reason: FinishReason


@dataclass(frozen=True)
class BeamChoice:
    """A running beam for the next step: ``token`` appended to running beam ``parent``."""

    parent: int
    token: int
    token_log_prob: float
    score: float  # running sum of log-probabilities


# Decides whether appending ``token`` to running beam ``parent`` finishes it, and why.
FinishCheck = Callable[[int, int], FinishReason]


class BeamSearch:
    def __init__(self, *, beam_width: int, length_penalty: float, early_stopping: int,
                 max_new_tokens: int) -> None:
        self.beam_width = beam_width
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping  # 1: True, 0: False (heuristic), -1: "never"
        self.max_new_tokens = max_new_tokens
        self.running_scores = torch.zeros(1, dtype=torch.float32)
        self.finished: list[FinishedBeam] = []
        self.done = False
        self._improvable = True  # HF: is_early_stop_heuristic_unsatisfied

    def step(self, log_probs: torch.Tensor, beams: Sequence[BeamHistory], generated_len: int,
             check: FinishCheck) -> list[BeamChoice]:
        """``log_probs`` [len(beams), V] (processed log-softmax of each running beam), all beams
        having ``generated_len`` generated tokens. Returns the next running beams, best first."""
        k = self.beam_width
        vocab = log_probs.shape[1]
        accumulated = (log_probs.float() + self.running_scores[:, None]).reshape(-1)
        top_scores, top_index = torch.topk(accumulated, min(2 * k, accumulated.numel()))
        considered = min(k, top_scores.numel())  # candidates allowed to finish / run on
        parents = (top_index // vocab).tolist()
        tokens = (top_index % vocab).tolist()
        reasons = [check(p, t) for p, t in zip(parents, tokens, strict=True)]
        hits = torch.tensor([r is not FinishReason.NOT_FINISHED for r in reasons])
        gen_len = generated_len + 1

        running = top_scores + hits.to(torch.float32) * DEAD_SCORE
        keep = torch.topk(running, considered).indices.tolist()
        choices = [BeamChoice(parent=parents[i], token=tokens[i],
                              token_log_prob=float(log_probs[parents[i], tokens[i]]),
                              score=float(running[i])) for i in keep]
        self.running_scores = running[keep]

        full = len(self.finished) == k
        if self._improvable and not (full and self.early_stopping == 1):
            normalized = top_scores / (gen_len ** self.length_penalty)
            for i in range(considered):
                if reasons[i] is not FinishReason.NOT_FINISHED:
                    self._add_finished(beams[parents[i]], tokens[i], reasons[i],
                                       float(log_probs[parents[i], tokens[i]]),
                                       float(top_scores[i]), float(normalized[i]))
        self._update_done(gen_len, bool(hits.all()))
        return choices

    def _add_finished(self, parent: BeamHistory, token: int, reason: FinishReason,
                      token_log_prob: float, cum_log_prob: float, score: float) -> None:
        tokens = list(parent.generated)
        log_probs = list(parent.log_probs)
        if reason is not FinishReason.END_ID:
            tokens.append(token)
            log_probs.append(token_log_prob)
        self.finished.append(FinishedBeam(score=score, cum_log_prob=cum_log_prob,
                                          tokens=tokens, log_probs=log_probs, reason=reason))
        self.finished.sort(key=lambda beam: beam.score, reverse=True)
        del self.finished[self.beam_width:]

    def _update_done(self, gen_len: int, every_candidate_finished: bool) -> None:
        if self.early_stopping == -1 and self.length_penalty > 0.0:
            best_length = self.max_new_tokens
        else:
            best_length = gen_len
        best_possible = self.running_scores[:1] / (best_length ** self.length_penalty)
        full = len(self.finished) == self.beam_width
        worst = min(b.score for b in self.finished) if full else DEAD_SCORE
        self._improvable = self._improvable and bool(best_possible[0] > worst)
        self.done = (not self._improvable or (full and self.early_stopping == 1)
                     or every_candidate_finished)

    def best(self, count: int) -> list[FinishedBeam]:
        return self.finished[:count]
