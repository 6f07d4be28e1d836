"""Decoding state of one request: its sequences (beams or returned sequences), their tokens,
KV block tables and log-probabilities.

A ``Sequence`` holds prompt + generated tokens; ``num_cached`` of them have keys/values in the
pool (through ``block_table``). Between iterations a running sequence has exactly one token more
than it has cached: the token chosen last, which the next iteration computes. Pausing a request
drops every block and sets ``num_cached`` to 0; the next iteration recomputes the whole sequence
and then continues exactly where it stopped.

Block reuse and chunked context (``attach_cached_prefix``, ``advance_chunk``): a request with
one sequence and no cached tokens (new or resumed) starts from the blocks of its longest cached
prefix of full blocks (never the whole sequence: its last token is always computed, for its
logits); a context may be computed over several iterations, and tokens are chosen only in the
iteration that computes its last token. ``name_computed_blocks`` names each block once it is
full, so later requests can reuse it.

``RequestState`` also implements the scheduler's view of a request (``Schedulable``).
Threads: executor loop thread only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from shoal.llm.beam_search import BeamSearch
from shoal.llm.kv_cache import BlockManager
from shoal.llm.prefix_cache import extend_keys
from shoal.llm.request import FinishReason, Request
from shoal.llm.sampling import DecodingParams


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
    block_keys: list[bytes] = field(default_factory=list)  # chain keys of its first full blocks
    num_named: int = 0  # blocks of ``block_table`` named for reuse (a prefix of the table)
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
                        generator=generator, block_keys=list(self.block_keys),
                        num_named=self.num_named)

    def keys_for(self, num_blocks: int, tokens_per_block: int) -> list[bytes]:
        """The chain keys of the first ``num_blocks`` full blocks (computed once, kept)."""
        extend_keys(self.block_keys, self.tokens, tokens_per_block, num_blocks)
        return self.block_keys


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
        output = request.output_config
        # greedy with nothing that needs the logits rows (the engine takes the token from the
        # iteration's batched argmax and never slices or copies this request's logits)
        self.plain_greedy = (self.params.greedy and not self.params.processes_logits
                             and self.beam is None and not output.return_log_probs
                             and not output.num_top_log_probs
                             and not output.return_generation_logits
                             and request.guided_decoding_params is None)
        self.context_logits: torch.Tensor | None = None
        self.context_logits_sent = False
        self.decoding_iter = 0
        self.paused = False
        self.cancelled = False
        self.prefilled = False  # the context is computed (reset when paused)
        self.reused_blocks = 0  # blocks taken from the cache, over the request's life
        self.missed_blocks = 0  # context blocks not found there

    # --- the scheduler's view (``scheduler.Schedulable``) ---

    def step_tokens(self, blocks: BlockManager) -> int:
        cached = len(self._cached_prefix(blocks)) * blocks.tokens_per_block
        return sum(len(s.tokens) - s.num_cached for s in self.active) - cached

    def chunkable(self) -> bool:
        return (len(self.active) == 1 and not self._wants_context_logits
                and len(self.active[0].tokens) - self.active[0].num_cached > 1)

    def step_block_demand(self, blocks: BlockManager, num_tokens: int) -> int:
        prefix = self._cached_prefix(blocks)
        if prefix:
            cached = len(prefix) * blocks.tokens_per_block
            return (blocks.attach_demand(prefix)
                    + blocks.blocks_for_tokens(cached + num_tokens) - len(prefix))
        if len(self.active) == 1:
            seq = self.active[0]
            return blocks.write_demand(seq.block_table, seq.num_cached, num_tokens)
        return sum(blocks.write_demand(s.block_table, s.num_cached, len(s.tokens) - s.num_cached)
                   for s in self.active)

    def held_blocks(self) -> int:
        return len({b for s in self.active for b in s.block_table})

    def freeable_blocks(self, blocks: BlockManager) -> int:
        """Blocks that go back to the pool if the request is paused now: those only its own
        sequences reference (not a prefix shared with another request)."""
        counts: dict[int, int] = {}
        for seq in self.active:
            for block in seq.block_table:
                counts[block] = counts.get(block, 0) + 1
        return sum(1 for block, count in counts.items() if blocks.refcount(block) == count)

    def max_block_demand(self, tokens_per_block: int) -> int:
        width = max(self.beam_width, self.num_return_sequences)
        total = len(self.request.input_token_ids) + self.request.max_tokens
        return width * math.ceil(total / tokens_per_block)

    # --- state changes ---

    @property
    def in_context_phase(self) -> bool:
        return not self.prefilled

    @property
    def _wants_context_logits(self) -> bool:
        return self.request.output_config.return_context_logits

    def _reuse_candidate(self, blocks: BlockManager) -> Sequence | None:
        if not blocks.enable_reuse or len(self.active) != 1 or self._wants_context_logits:
            return None  # context logits need every prompt position computed
        seq = self.active[0]
        return seq if seq.num_cached == 0 and not seq.block_table else None

    def _cached_prefix(self, blocks: BlockManager) -> list[int]:
        seq = self._reuse_candidate(blocks)
        if seq is None:
            return []
        usable = (len(seq.tokens) - 1) // blocks.tokens_per_block
        return blocks.cached_prefix(seq.keys_for(usable, blocks.tokens_per_block)[:usable])

    def attach_cached_prefix(self, blocks: BlockManager) -> None:
        """Before the iteration computes this request: start a new or resumed sequence from the
        blocks of its longest cached prefix (no-op otherwise)."""
        seq = self._reuse_candidate(blocks)
        if seq is None:
            return
        prefix = self._cached_prefix(blocks)
        blocks.attach(seq.block_table, prefix, blocks.blocks_for_tokens(len(seq.tokens)))
        self.reused_blocks += len(prefix)
        self.missed_blocks += blocks.blocks_for_tokens(len(seq.tokens)) - len(prefix)
        seq.num_cached = len(prefix) * blocks.tokens_per_block
        seq.num_named = len(prefix)

    def advance_chunk(self, blocks: BlockManager, computed: int) -> bool:
        """After an iteration that computed ``computed`` tokens of this request's single
        sequence: True (and the tokens cached) when the context is not complete yet, so no
        token is chosen this time; False when the sequence can be decoded."""
        (seq,) = self.active
        if seq.num_cached + computed >= len(seq.tokens):
            return False
        seq.num_cached += computed
        self.name_computed_blocks(blocks, [seq])
        return True

    def mark_computed(self, blocks: BlockManager) -> None:
        """After an iteration that computed every uncached token of the active sequences (the
        tokens to choose come next): all are cached, the context is done, full blocks named."""
        for seq in self.active:
            seq.num_cached = len(seq.tokens)
        self.prefilled = True
        self.name_computed_blocks(blocks, self.active)

    def name_computed_blocks(self, blocks: BlockManager, sequences: list[Sequence]) -> None:
        """Name the blocks of ``sequences`` that became full with computed tokens."""
        if not blocks.enable_reuse:
            return
        size = blocks.tokens_per_block
        for seq in sequences:
            full = seq.num_cached // size
            if full > seq.num_named:
                blocks.name_blocks(seq.block_table, seq.keys_for(full, size), seq.num_named,
                                   full)
                seq.num_named = full

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
            seq.num_named = 0
        self.prefilled = False

    def max_generated(self) -> int:
        return max((s.num_generated for s in self.active + self.done), default=0)
