"""Decoding state of one request: its sequences (beams or returned sequences), their tokens,
KV block tables and log-probabilities.

A ``Sequence`` holds prompt + generated tokens; ``num_cached`` of them have keys/values in the
pool (through ``block_table``). Between iterations a running sequence has exactly one token more
than it has cached: the token chosen last, which the next iteration computes. Pausing a request
drops every block and sets ``num_cached`` to 0; the next iteration recomputes the whole sequence
and then continues exactly where it stopped.

``RequestState`` also implements the scheduler's view of a request (``Schedulable``).
Threads: executor loop thread only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from shoal.workers.llm.beam_search import BeamSearch
from shoal.workers.llm.kv_cache import BlockManager
from shoal.workers.llm.request import FinishReason, Request
from shoal.workers.llm.sampling import DecodingParams


@dataclass
class Sequence:
    tokens: list[int]
    prompt_len: int
    index: int  # sequence_index with sampling; beam slot with beam search
    num_cached: int = 0
    block_table: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)  # one per generated token
    cum_log_prob: float = 0.0
    generator: torch.Generator | None = None
    finish_reason: FinishReason = FinishReason.NOT_FINISHED
    num_sent: int = 0  # generated tokens already delivered in streamed results
    pending_logits: list[torch.Tensor] = field(default_factory=list)  # not yet delivered
    # OutputConfig.num_top_log_probs: (token, log-prob) alternatives per generated token
    top_log_probs: list[list[tuple[int, float]]] = field(default_factory=list)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def finished(self) -> bool:
        return self.finish_reason is not FinishReason.NOT_FINISHED

    def fork(self, blocks: BlockManager, index: int) -> Sequence:
        """A child sharing this sequence's blocks (copy-on-write) and history."""
        generator = None
        if self.generator is not None:
            generator = torch.Generator().set_state(self.generator.get_state())
        return Sequence(tokens=list(self.tokens), prompt_len=self.prompt_len, index=index,
                        num_cached=self.num_cached, block_table=blocks.fork(self.block_table),
                        log_probs=list(self.log_probs), cum_log_prob=self.cum_log_prob,
                        generator=generator)


class RequestState:
    def __init__(self, request_id: int, request: Request, arrival: float) -> None:
        self.request_id = request_id
        self.request = request
        self.arrival = arrival  # time.monotonic() at enqueue (statistics only)
        self.params = DecodingParams.from_request(request)
        config = request.sampling_config
        self.beam_width = config.beam_width
        self.num_return_sequences = request.effective_num_return_sequences
        prompt = [int(token) for token in request.input_token_ids]
        self.prompt = prompt
        first = Sequence(tokens=list(prompt), prompt_len=len(prompt), index=0,
                         generator=None if self.params.greedy else self.params.generator(0))
        self.active: list[Sequence] = [first]  # sequences computed by the next iteration
        self.done: list[Sequence] = []  # finished sequences (sampling)
        self.beam: BeamSearch | None = None
        if self.beam_width > 1:
            self.beam = BeamSearch(
                beam_width=self.beam_width,
                length_penalty=0.0 if config.length_penalty is None else config.length_penalty,
                early_stopping=1 if config.early_stopping is None else config.early_stopping,
                max_new_tokens=request.max_tokens)
        self.forked = self.num_return_sequences == 1 or self.beam is not None
        self.context_logits: torch.Tensor | None = None
        self.context_logits_sent = False
        self.decoding_iter = 0
        self.paused = False
        self.cancelled = False

    # --- the scheduler's view (``scheduler.Schedulable``) ---

    def step_tokens(self) -> int:
        return sum(len(s.tokens) - s.num_cached for s in self.active)

    def step_block_demand(self, blocks: BlockManager) -> int:
        return sum(blocks.write_demand(s.block_table, s.num_cached, len(s.tokens) - s.num_cached)
                   for s in self.active)

    def held_blocks(self) -> int:
        return len({b for s in self.active for b in s.block_table})

    def max_block_demand(self, tokens_per_block: int) -> int:
        width = max(self.beam_width, self.num_return_sequences)
        total = len(self.request.input_token_ids) + self.request.max_tokens
        return width * math.ceil(total / tokens_per_block)

    # --- state changes ---

    @property
    def in_context_phase(self) -> bool:
        return any(s.num_cached == 0 for s in self.active)

    @property
    def finished(self) -> bool:
        if self.beam is not None:
            return self.beam.done
        return not self.active

    def release(self, blocks: BlockManager) -> None:
        """Free every block of the request (pause, finish or cancel)."""
        for seq in self.active:
            blocks.release(seq.block_table)
            seq.num_cached = 0

    def max_generated(self) -> int:
        return max((s.num_generated for s in self.active + self.done), default=0)
