"""One decoding iteration: scheduler decision -> KV block writes -> model step -> token choice
-> results. Synchronous and single-threaded (the executor's loop thread calls it), so it can be
driven directly in tests.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from shoal.llm.attention import SequenceSpan, build_attention_batch
from shoal.llm.decode_copy import DecodeKvCopy
from shoal.llm.kernels import cpu_kernels
from shoal.llm.kv_cache import BlockManager, KvCachePool
from shoal.llm.logits.post_process import LogitsPostProcessing
from shoal.llm.logits.top_log_probs import TopLogProbs, top_log_probs
from shoal.llm.models import CausalLM
from shoal.llm.request import FinishReason, Result
from shoal.llm.results import beam_results, cancelled_results, sampling_results
from shoal.llm.sampling import TokenRow, choose_tokens, process_logits
from shoal.llm.scheduler import Scheduler
from shoal.llm.sequence import RequestState, Sequence

if TYPE_CHECKING:
    from shoal.llm.guided.decoder import GuidedDecoder

logger = logging.getLogger(__name__)


@dataclass
class StepReport:
    results: list[tuple[int, Result]] = field(default_factory=list)  # (request id, result)
    completed: list[int] = field(default_factory=list)  # request ids that ended this iteration
    scheduled: list[RequestState] = field(default_factory=list)
    context_ids: set[int] = field(default_factory=set)  # requests in their context phase
    num_new: int = 0
    num_paused: int = 0
    num_ctx_tokens: int = 0
    num_gen_tokens: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)  # (request id, why it failed)


@dataclass
class _Batch:
    token_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    spans: list[SequenceSpan] = field(default_factory=list)
    logits_rows: list[int] = field(default_factory=list)
    last_row: dict[int, int] = field(default_factory=dict)  # id(Sequence) -> index in logits
    context_rows: dict[int, tuple[int, int]] = field(default_factory=dict)  # request id -> rows
    partial: dict[int, int] = field(default_factory=dict)  # request id -> tokens of a context
    # chunk that does not complete its context (no logits row, no token chosen)


class Engine:
    def __init__(self, model: CausalLM, kv: KvCachePool, blocks: BlockManager,
                 scheduler: Scheduler[RequestState],
                 post_processing: LogitsPostProcessing | None = None) -> None:
        self.model = model
        self.post_processing = post_processing or LogitsPostProcessing(None)
        self.kv = kv
        self.blocks = blocks
        self.scheduler = scheduler
        self.requests: dict[int, RequestState] = {}
        self.guided: GuidedDecoder | None = None  # masks the logits of guided requests
        storage = kv.storage  # [layers, 2, slots, Hkv, D]
        # the compiled attention reads only each row's own keys, so spare width in the kept
        # copy costs it nothing, and doubling it saves copying it whole whenever the longest
        # row reaches a new block
        compiled = (storage.device.type == "cpu" and storage.dtype == torch.float32
                    and cpu_kernels() is not None)
        self._row_masks = not compiled  # the compiled decode attention reads row lengths
        self._decode_copy = DecodeKvCopy(storage.shape[0] * 2 * storage.shape[3]
                                         * storage.shape[4] * storage.element_size(),
                                         width_growth=2.0 if compiled else 1.0)

    @property
    def has_work(self) -> bool:
        return bool(self.requests)

    def add(self, state: RequestState) -> None:
        self.requests[state.request_id] = state
        self.scheduler.add(state)

    def cancel(self, request_id: int) -> list[Result]:
        """Final CANCELLED results of a live request (its blocks go back to the pool); [] when
        the request is unknown or already ended."""
        state = self.requests.pop(request_id, None)
        if state is None:
            return []
        self.scheduler.remove(request_id)
        state.release(self.blocks)
        return cancelled_results(state)

    def abort_all(self) -> list[int]:
        """Drop every live request (after a failed iteration); returns their ids."""
        ids = list(self.requests)
        self._decode_copy.forget()
        for request_id in ids:
            self.scheduler.remove(request_id)
            self.requests.pop(request_id).release(self.blocks)
        return ids

    def step(self) -> StepReport:
        self.blocks.start_iteration()
        plan = self.scheduler.schedule()
        report = StepReport(scheduled=plan.scheduled, num_new=len(plan.admitted),
                            num_paused=len(plan.paused))
        for state in plan.paused:
            state.release(self.blocks)
            state.paused = True
            logger.debug("request %d paused to free KV blocks", state.request_id)
        if not plan.scheduled:
            return report
        for state in plan.scheduled:
            state.attach_cached_prefix(self.blocks)  # block reuse
        batch = self._pack(plan.scheduled, report, plan.chunks)
        logits = self._run_model(batch)
        decoding = [s for s in plan.scheduled if s.request_id not in batch.partial]
        failed = self.post_processing.apply_to_iteration(logits, decoding, batch.last_row)
        # one call serves every greedy sequence; max's indices are argmax's (the first
        # maximum of a row, NaN propagating), at less than half its cost on the CPU
        argmax = logits.max(dim=-1).indices.tolist()
        for state in plan.scheduled:
            state.paused = False
            if state.request_id in batch.partial:  # chunked context, not complete yet
                state.advance_chunk(self.blocks, batch.partial[state.request_id])
                continue
            state.mark_computed(self.blocks)
            if state.request_id in failed:  # its logits post-processor raised: it alone ends
                self._complete(state)
                report.completed.append(state.request_id)
                report.errors.append((state.request_id, failed[state.request_id]))
                continue
            if batch.context_rows.get(state.request_id):
                first, last = batch.context_rows[state.request_id]
                state.context_logits = logits[first:last].cpu()
            rows = [batch.last_row[id(s)] for s in state.active]
            if state.plain_greedy and state.forked:
                results = self._decode_greedy(state, [argmax[r] for r in rows])
            else:
                results = self._decode(state, logits[rows], [argmax[r] for r in rows])
            report.results += [(state.request_id, r) for r in results]
            if state.finished:
                self._complete(state)
                report.completed.append(state.request_id)
        return report

    def _pack(self, scheduled: list[RequestState], report: StepReport,
              chunks: dict[int, int]) -> _Batch:
        batch = _Batch()
        copies: list[tuple[int, int]] = []
        for state in scheduled:
            if state.in_context_phase:
                report.context_ids.add(state.request_id)
            for seq in state.active:
                new = len(seq.tokens) - seq.num_cached
                chunk = chunks.get(state.request_id, new)
                if chunk < new:
                    new = batch.partial[state.request_id] = chunk
                copies += self.blocks.prepare_write(seq.block_table, seq.num_cached, new)
                start = len(batch.token_ids)
                batch.spans.append(SequenceSpan(start, new, seq.num_cached, seq.block_table,
                                                seq))
                batch.token_ids += seq.tokens[seq.num_cached:seq.num_cached + new]
                batch.positions += range(seq.num_cached, seq.num_cached + new)
                if state.in_context_phase:
                    report.num_ctx_tokens += new
                else:
                    report.num_gen_tokens += new
                if state.request_id in batch.partial:
                    continue
                if (state.request.output_config.return_context_logits
                        and state.context_logits is None and seq.num_generated == 0):
                    first = len(batch.logits_rows)
                    batch.logits_rows += range(start, start + new)
                    batch.context_rows[state.request_id] = (first, len(batch.logits_rows))
                else:
                    batch.logits_rows.append(start + new - 1)
                batch.last_row[id(seq)] = len(batch.logits_rows) - 1
        self.kv.copy_blocks(copies)
        return batch

    def _run_model(self, batch: _Batch) -> torch.Tensor:
        device = self.kv.storage.device
        attention = build_attention_batch(batch.spans, self.blocks, device, self.model.dtype,
                                          self._decode_copy, row_mask=self._row_masks)
        with torch.inference_mode():
            logits = self.model.forward(
                torch.tensor(batch.token_ids, dtype=torch.long, device=device),
                torch.tensor(batch.positions, dtype=torch.long, device=device),
                attention, self.kv,
                torch.tensor(batch.logits_rows, dtype=torch.long, device=device))
        return logits

    def _decode_greedy(self, state: RequestState, argmax: list[int]) -> list[Result]:
        """``_decode`` of a ``plain_greedy`` request whose sequences are forked: each takes the
        batched argmax of its row (the same token and no log-probability, as ``choose_tokens``
        gives such rows), without touching the logits tensor."""
        for seq in state.active:
            seq.num_cached = len(seq.tokens)
        state.decoding_iter += 1
        touched = list(state.active)
        for seq, token in zip(touched, argmax, strict=True):
            self._append(state, seq, token, None, None, [])
        return self._retire(state, touched)

    def _decode(self, state: RequestState, logits: torch.Tensor,
                argmax: list[int]) -> list[Result]:
        for seq in state.active:
            seq.num_cached = len(seq.tokens)
        state.decoding_iter += 1
        if state.beam is not None:
            self._beam_step(state, logits)
            return beam_results(state)
        if not state.forked:
            logits = self._fork(state, logits)
            argmax = argmax * len(state.active)
        touched = list(state.active)
        want_log_probs = state.request.output_config.return_log_probs
        rows = [TokenRow(state.params, s.tokens, s.num_generated, s.generator, want_log_probs)
                for s in touched]
        choosing: torch.Tensor = logits
        known_argmax: list[int] | None = argmax
        if self.guided is not None and state.request.guided_decoding_params is not None:
            choosing, known_argmax = self.guided.constrain(state, touched, logits), None
        choices = choose_tokens(choosing, rows, known_argmax)
        tops = top_log_probs(choosing, rows, state.request.output_config.num_top_log_probs)
        for seq, row_logits, (token, log_prob), top in zip(touched, logits, choices, tops,
                                                           strict=True):
            self._append(state, seq, token, log_prob, row_logits, top)
        if self.guided is not None:
            self.guided.advance(state, touched)
        return self._retire(state, touched)

    def _retire(self, state: RequestState, touched: list[Sequence]) -> list[Result]:
        """After the sequences ``touched`` took their token: the finished ones leave (their
        blocks go back) and the iteration's results are built."""
        state.active = [s for s in touched if not s.finished]
        for seq in touched:
            if seq.finished:
                self.blocks.release(seq.block_table)
                state.done.append(seq)
        return sampling_results(state, touched)

    def _fork(self, state: RequestState, logits: torch.Tensor) -> torch.Tensor:
        """Split the prompt sequence into the request's returned sequences, sharing its blocks;
        each draws its first token from the same logits with its own generator."""
        (parent,) = state.active
        children = [parent.fork(self.blocks, index)
                    for index in range(state.num_return_sequences)]
        for child in children:
            if child.generator is not None:
                child.generator = state.params.generator(child.index)
        self.blocks.release(parent.block_table)
        state.active = children
        state.forked = True
        return logits.expand(len(children), -1)

    def _append(self, state: RequestState, seq: Sequence, token: int, log_prob: float | None,
                raw_logits: torch.Tensor | None, top: TopLogProbs) -> None:
        params = state.params
        if log_prob is not None:
            seq.cum_log_prob += log_prob
        if token == params.end_id:
            seq.finish_reason = FinishReason.END_ID
            return
        seq.tokens.append(token)
        if log_prob is not None:
            seq.log_probs.append(log_prob)
        if state.request.output_config.num_top_log_probs:
            seq.top_log_probs.append(top)
        if state.request.output_config.return_generation_logits and raw_logits is not None:
            seq.pending_logits.append(raw_logits.cpu())
        seq.finish_reason = self._finish_reason(state, seq.generated)

    @staticmethod
    def _finish_reason(state: RequestState, generated: list[int]) -> FinishReason:
        for word in state.params.stop_words:
            if len(generated) >= len(word) and tuple(generated[-len(word):]) == word:
                return FinishReason.STOP_WORDS
        if len(generated) >= state.request.max_tokens:
            return FinishReason.LENGTH
        return FinishReason.NOT_FINISHED

    def _beam_step(self, state: RequestState, logits: torch.Tensor) -> None:
        assert state.beam is not None
        beams = state.active
        params = state.params
        log_probs = torch.log_softmax(logits, dim=-1).cpu()  # the search runs on the host
        if params.processes_logits:
            log_probs = torch.stack([process_logits(row, params, s.tokens, s.num_generated)
                                     for row, s in zip(log_probs, beams, strict=True)])
        generated_len = beams[0].num_generated

        def check(parent: int, token: int) -> FinishReason:
            if token == params.end_id:
                return FinishReason.END_ID
            return self._finish_reason(state, [*beams[parent].generated, token])

        choices = state.beam.step(log_probs, beams, generated_len, check)
        survivors: list[Sequence] = []
        if not state.beam.done:
            for slot, choice in enumerate(choices):
                child = beams[choice.parent].fork(self.blocks, slot)
                child.tokens.append(choice.token)
                child.log_probs.append(choice.token_log_prob)
                child.cum_log_prob = choice.score
                survivors.append(child)
        for seq in beams:
            self.blocks.release(seq.block_table)
        state.active = survivors

    def _complete(self, state: RequestState) -> None:
        self.scheduler.remove(state.request_id)
        state.release(self.blocks)
        del self.requests[state.request_id]
