"""Turning a request's decoding state into ``Result``s after an iteration (or a cancel), with
TRT-LLM's streaming / final-flag semantics (see ``request.py``)."""

from __future__ import annotations

import torch

from shoal.llm.request import FinishReason, Result
from shoal.llm.sequence import RequestState, Sequence


def sampling_results(state: RequestState, touched: list[Sequence]) -> list[Result]:
    """Results for the sequences decoded this iteration (sampling / greedy requests). Streaming:
    one per sequence that has new tokens or finished. Otherwise: one per finished sequence.
    ``is_final`` marks the last result once every sequence has finished."""
    request = state.request
    want_log_probs = request.output_config.return_log_probs
    results: list[Result] = []
    for seq in sorted(touched, key=lambda s: s.index):
        if request.streaming:
            first = 0 if request.return_all_generated_tokens else seq.num_sent
            tokens = seq.generated[first:]
            if not tokens and not seq.finished:
                continue
        elif not seq.finished:
            continue
        else:
            first = 0
            exclude = request.output_config.exclude_input_from_output
            tokens = seq.generated if exclude else list(seq.tokens)
        seq.num_sent = seq.num_generated
        results.append(Result(
            is_final=False,
            output_token_ids=[tokens],
            finish_reasons=[seq.finish_reason],
            sequence_index=seq.index,
            is_sequence_final=seq.finished,
            cum_log_probs=[seq.cum_log_prob] if want_log_probs else None,
            log_probs=[seq.log_probs[first:]] if want_log_probs else None,
            generation_logits=_take_logits(seq),
            decoding_iter=state.decoding_iter,
            top_log_probs=([seq.top_log_probs[first:]]
                           if request.output_config.num_top_log_probs else None),
        ))
    return _finish(state, results)


def beam_results(state: RequestState) -> list[Result]:
    """The final result (best ``num_return_sequences`` finished beams) once the search is done;
    while streaming, the current best running beams (all their generated tokens)."""
    assert state.beam is not None
    request = state.request
    count = state.num_return_sequences
    want_log_probs = request.output_config.return_log_probs
    if state.beam.done:
        best = state.beam.best(count)
        prompt = ([] if request.streaming or request.output_config.exclude_input_from_output
                  else state.prompt)
        result = Result(
            is_final=True, output_token_ids=[prompt + b.tokens for b in best],
            finish_reasons=[b.reason for b in best], is_sequence_final=True,
            cum_log_probs=[b.cum_log_prob for b in best] if want_log_probs else None,
            log_probs=[b.log_probs for b in best] if want_log_probs else None,
            decoding_iter=state.decoding_iter)
        return _finish(state, [result])
    if not request.streaming:
        return []
    running = state.active[:count]
    return _finish(state, [Result(
        is_final=False, output_token_ids=[s.generated for s in running],
        finish_reasons=[FinishReason.NOT_FINISHED] * len(running),
        cum_log_probs=[s.cum_log_prob for s in running] if want_log_probs else None,
        log_probs=[list(s.log_probs) for s in running] if want_log_probs else None,
        decoding_iter=state.decoding_iter)])


def cancelled_results(state: RequestState) -> list[Result]:
    """Final results of a cancelled request: every unfinished sequence (every returned sequence
    index when the request had not started) ends with FinishReason.CANCELLED."""
    if state.beam is not None:
        running = state.active[:state.num_return_sequences]
        prompt = [] if state.request.streaming else state.prompt
        return _finish(state, [Result(
            is_final=True, output_token_ids=[prompt + s.generated for s in running],
            finish_reasons=[FinishReason.CANCELLED] * len(running), is_sequence_final=True,
            decoding_iter=state.decoding_iter)])
    touched = list(state.active)
    if not state.forked:
        touched = [Sequence(tokens=list(s.tokens), prompt_len=s.prompt_len, index=i)
                   for s in state.active for i in range(state.num_return_sequences)]
    for seq in touched:
        seq.finish_reason = FinishReason.CANCELLED
    state.active = []
    return sampling_results(state, touched)


def _finish(state: RequestState, results: list[Result]) -> list[Result]:
    if results and not state.context_logits_sent and state.context_logits is not None:
        results[0].context_logits = state.context_logits
        state.context_logits_sent = True
    if results and state.finished:
        results[-1].is_final = True
    return results


def _take_logits(seq: Sequence) -> torch.Tensor | None:
    if not seq.pending_logits:
        return None
    logits = torch.stack(seq.pending_logits)
    seq.pending_logits.clear()
    return logits
