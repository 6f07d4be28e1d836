"""Choosing the next token of each sequence from its logits row.

Order of operations for one row (TRT-LLM's, see ``SamplingConfig``): repetition / presence /
frequency penalties over the prompt and output tokens, bad words and ``min_tokens`` (banned
tokens get -inf), then greedy argmax, or temperature, top-k, top-p and a draw from the
sequence's own seeded generator. The reported log-probability is taken after temperature and
before top-k / top-p truncation. Rows that need none of this (plain greedy) are decided with one
batched argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shoal.llm.request import Request

SEED_STRIDE = 0x9E3779B97F4A7C15  # sequence i of a request draws from seed + i * stride (mod 2**64)


@dataclass(frozen=True)
class DecodingParams:
    """A request's sampling configuration with defaults applied."""

    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    seed: int
    min_tokens: int
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    end_id: int | None
    bad_words: tuple[tuple[int, ...], ...]
    stop_words: tuple[tuple[int, ...], ...]

    @classmethod
    def from_request(cls, request: Request) -> DecodingParams:
        config = request.sampling_config
        top_k = config.top_k or 0
        top_p = config.top_p or 0.0
        temperature = 1.0 if config.temperature is None else config.temperature
        greedy = temperature == 0.0 or top_k == 1 or (top_k == 0 and top_p == 0.0)
        return cls(
            greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p,
            seed=config.seed or 0, min_tokens=config.min_tokens or 0,
            repetition_penalty=config.repetition_penalty or 1.0,
            presence_penalty=config.presence_penalty or 0.0,
            frequency_penalty=config.frequency_penalty or 0.0,
            end_id=request.end_id,
            bad_words=tuple(tuple(w) for w in request.bad_words or ()),
            stop_words=tuple(tuple(w) for w in request.stop_words or ()),
        )

    @property
    def processes_logits(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0 or bool(self.bad_words)
                or (self.min_tokens > 0 and self.end_id is not None))

    def generator(self, sequence_index: int) -> torch.Generator:
        return torch.Generator().manual_seed((self.seed + sequence_index * SEED_STRIDE) % 2**64)


@dataclass
class TokenRow:
    """One sequence to decide for: its tokens so far (prompt + generated)."""

    params: DecodingParams
    tokens: list[int]
    num_generated: int
    generator: torch.Generator | None
    want_log_prob: bool


def process_logits(row: torch.Tensor, params: DecodingParams, tokens: list[int],
                   num_generated: int) -> torch.Tensor:
    """Penalties, bad words and min_tokens applied to one [V] row (a new tensor)."""
    row = row.clone()
    if (params.repetition_penalty != 1.0 or params.presence_penalty != 0.0
            or params.frequency_penalty != 0.0):
        counts = torch.bincount(torch.tensor(tokens, device=row.device),
                                minlength=row.shape[0])[:row.shape[0]].to(row.dtype)
        seen = counts > 0
        if params.repetition_penalty != 1.0:
            penalized = torch.where(row > 0, row / params.repetition_penalty,
                                    row * params.repetition_penalty)
            row = torch.where(seen, penalized, row)
        row = row - params.presence_penalty * seen.to(row.dtype)
        row = row - params.frequency_penalty * counts
    for word in params.bad_words:
        if len(word) == 1 or tuple(tokens[len(tokens) - len(word) + 1:]) == word[:-1]:
            row[word[-1]] = float("-inf")
    if params.end_id is not None and num_generated < params.min_tokens:
        row[params.end_id] = float("-inf")
    return row


def choose_tokens(logits: torch.Tensor, rows: list[TokenRow],
                  argmax: list[int] | None = None) -> list[tuple[int, float | None]]:
    """(token, log-probability or None) for each row of ``logits`` [N, V]. ``argmax``, when
    given, is ``logits.argmax(-1)`` already computed (for the whole iteration at once)."""
    chosen: list[tuple[int, float | None]] = [(0, None)] * len(rows)
    plain = [i for i, r in enumerate(rows) if r.params.greedy and not r.params.processes_logits]
    if plain:
        if argmax is None:
            argmax = logits.argmax(dim=-1).tolist()
        tokens = [argmax[i] for i in plain]
        log_probs: list[float | None] = [None] * len(plain)
        if any(rows[i].want_log_prob for i in plain):
            gathered = torch.log_softmax(logits[plain], dim=-1).gather(
                1, torch.tensor(tokens, device=logits.device)[:, None])
            log_probs = [float(x) for x in gathered[:, 0].tolist()]
        for slot, (i, token) in enumerate(zip(plain, tokens, strict=True)):
            chosen[i] = (int(token), log_probs[slot] if rows[i].want_log_prob else None)
    for i, row in enumerate(rows):
        if not (row.params.greedy and not row.params.processes_logits):
            chosen[i] = _choose_one(logits[i], row)
    return chosen


def _choose_one(logits: torch.Tensor, row: TokenRow) -> tuple[int, float | None]:
    params = row.params
    processed = process_logits(logits, params, row.tokens, row.num_generated)
    if params.greedy:
        token = int(processed.argmax())
        log_prob = torch.log_softmax(processed, dim=-1)[token] if row.want_log_prob else None
        return token, None if log_prob is None else float(log_prob)
    scaled_log_probs = torch.log_softmax(processed / params.temperature, dim=-1)
    token = _draw(truncate(scaled_log_probs, params.top_k, params.top_p), row.generator)
    return token, float(scaled_log_probs[token]) if row.want_log_prob else None


def truncate(log_probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Probabilities [V] (unnormalized) left after top-k and top-p (the smallest set of most
    likely tokens whose mass reaches top_p; the most likely token always stays)."""
    probs = log_probs.exp()
    if top_k > 0 and top_k < probs.shape[0]:
        kth = torch.topk(probs, top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if 0.0 < top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=0) / sorted_probs.sum()
        drop = (cumulative - sorted_probs / sorted_probs.sum()) >= top_p
        sorted_probs = torch.where(drop, torch.zeros_like(sorted_probs), sorted_probs)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return probs


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Inverse-CDF draw with one uniform from ``generator``: the same generator state gives the
    same token whatever device or batch the row came from."""
    uniform = float(torch.rand((), generator=generator))
    cumulative = torch.cumsum(probs.double(), dim=0)
    target = torch.tensor(uniform * float(cumulative[-1]), dtype=torch.float64,
                          device=probs.device)
    index = int(torch.searchsorted(cumulative, target, right=True))
    index = min(index, probs.shape[0] - 1)
    while float(probs[index]) == 0.0 and index > 0:  # never land on a truncated token
        index -= 1
    return index
