"""Guided decoding in the executor: token masks from xgrammar matchers.

One ``GuidedDecoder`` per executor (built from ``ExecutorConfig.guided_decoding_config``):

- ``request_error`` (any thread, at enqueue): the guide compiles (``GrammarCache``, so a bad
  schema / regex / grammar fails that request alone, before it is queued) and the request is
  one guided decoding can serve: an ``end_id`` (the only token that ends a guided output), no
  beam search, no ``bad_words`` / ``min_tokens`` (they could ban every token the grammar
  allows).
- ``constrain`` (loop thread, once per guided request per iteration, before the token choice):
  the logits rows of the request's sequences with every token the sequence's matcher refuses set
  to -inf (a new tensor; the raw logits stay as they are for generation logits). Unguided
  requests get their logits back untouched: guided and free requests share iterations.
- ``advance`` (loop thread, after the tokens were appended): each matcher accepts its sequence's
  new token; a finished sequence's matcher is dropped.

A matcher belongs to one sequence (``Sequence.index``) and tracks how many generated tokens it
has accepted, so a sequence whose matcher is missing or behind (the first iteration, the
sequences forked for ``num_return_sequences``) is caught up by replaying its tokens. The end id
is the matcher's only stop token: once the grammar is complete it is the only token left (or
the grammar may go on, e.g. ``[0-9]+``), so the sequence ends with END_ID exactly when the
guided text is whole. Output cut by ``max_tokens`` (LENGTH) can be incomplete.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from shoal.llm.guided.grammars import DEFAULT_CAPACITY, GrammarCache, GuideError
from shoal.llm.guided.params import GuidedDecodingConfig, GuidedDecodingParams
from shoal.llm.request import FinishReason, Request

if TYPE_CHECKING:
    import xgrammar

    from shoal.llm.sequence import RequestState, Sequence

logger = logging.getLogger(__name__)


@dataclass
class _Matcher:
    matcher: xgrammar.GrammarMatcher
    accepted: int = 0  # generated tokens of the sequence the matcher has accepted


@dataclass
class _GuidedRequest:
    grammar: xgrammar.CompiledGrammar
    end_id: int
    matchers: dict[int, _Matcher] = field(default_factory=dict)  # by Sequence.index


class GuidedDecoder:
    def __init__(self, config: GuidedDecodingConfig, vocab_size: int, *,
                 cache_capacity: int = DEFAULT_CAPACITY) -> None:
        """``vocab_size``: the model's logits width (at least the tokenizer's vocabulary;
        ids past the vocabulary are never allowed)."""
        import xgrammar

        self.vocab_size = vocab_size
        compiler = xgrammar.GrammarCompiler(tokenizer_info(config, vocab_size), max_threads=1,
                                            cache_enabled=False)
        self.grammars = GrammarCache(compiler, cache_capacity)
        self._requests: weakref.WeakKeyDictionary[RequestState, _GuidedRequest] = (
            weakref.WeakKeyDictionary())

    # --- enqueue (any thread) ---

    def request_error(self, request: Request) -> str | None:
        params = request.guided_decoding_params
        if params is None:
            return None
        message = unsupported_combination(request)
        if message is not None:
            return message
        try:
            self.grammars.get(params)
        except GuideError as exc:
            return f"guided_decoding_params.guide: {exc}"
        return None

    # --- loop thread ---

    def constrain(self, state: RequestState, seqs: list[Sequence],
                  logits: torch.Tensor) -> torch.Tensor:
        """``logits`` [len(seqs), V] with the tokens each sequence's grammar refuses at -inf;
        ``logits`` itself when the request is not guided."""
        guided = self._guided(state)
        if guided is None:
            return logits
        import xgrammar

        bitmask = xgrammar.allocate_token_bitmask(len(seqs), self.vocab_size)
        for row, seq in enumerate(seqs):
            self._synced(guided, seq).matcher.fill_next_token_bitmask(bitmask, row)
        allowed = self._allowed(bitmask, logits.shape[-1]).to(logits.device)
        return logits.masked_fill(~allowed, float("-inf"))

    def advance(self, state: RequestState, seqs: list[Sequence]) -> None:
        """Each sequence's matcher accepts the token appended this iteration."""
        guided = self._requests.get(state)
        if guided is None:
            return
        for seq in seqs:
            if seq.finished:  # END_ID (the grammar allowed it), LENGTH or a stop word
                guided.matchers.pop(seq.index, None)
                continue
            self._synced(guided, seq)

    # --- internals ---

    def _guided(self, state: RequestState) -> _GuidedRequest | None:
        guided = self._requests.get(state)
        params = state.request.guided_decoding_params
        if guided is None and params is not None:
            assert state.request.end_id is not None, "request_error lets no end_id through"
            guided = _GuidedRequest(self.grammars.get(params), state.request.end_id)
            self._requests[state] = guided
        return guided

    def _synced(self, guided: _GuidedRequest, seq: Sequence) -> _Matcher:
        """The sequence's matcher, after it accepted every generated token of the sequence.
        A token the grammar refuses (only when something after the mask banned every allowed
        token) ends the sequence."""
        import xgrammar

        entry = guided.matchers.get(seq.index)
        generated = seq.generated
        if entry is None or entry.accepted > len(generated):
            entry = _Matcher(xgrammar.GrammarMatcher(
                guided.grammar, override_stop_tokens=[guided.end_id], max_rollback_tokens=0))
            guided.matchers[seq.index] = entry
        for token in generated[entry.accepted:]:
            if not entry.matcher.accept_token(token):
                logger.error("guided decoding: the grammar refused token %d; ending the "
                             "sequence", token)
                seq.finish_reason = FinishReason.LENGTH
                break
            entry.accepted += 1
        return entry

    @staticmethod
    def _allowed(bitmask: torch.Tensor, width: int) -> torch.Tensor:
        """Bool [rows, width] from xgrammar's int32 bitmask [rows, ceil(V / 32)]: bit i of
        word w is token 32 w + i, so the little-endian bytes unpacked least significant bit
        first list the tokens in order."""
        as_bytes = bitmask.numpy().view(np.uint8)
        bits = np.unpackbits(as_bytes, axis=-1, bitorder="little")[:, :width]
        allowed = torch.from_numpy(bits.view(np.bool_))
        if allowed.shape[1] < width:  # logits wider than the vocabulary: the rest refused
            pad = torch.zeros(allowed.shape[0], width - allowed.shape[1], dtype=torch.bool)
            allowed = torch.cat([allowed, pad], dim=1)
        return allowed


def unsupported_combination(request: Request) -> str | None:
    """Why a guided request cannot be served as asked, or None."""
    if request.sampling_config.beam_width > 1:
        return ("guided_decoding_params cannot be combined with beam search "
                "(sampling_config.beam_width > 1); use beam_width 1")
    if request.end_id is None:
        return ("guided_decoding_params needs end_id: the end token is what closes a guided "
                "output")
    if request.bad_words:
        return ("guided_decoding_params cannot be combined with bad_words (a banned token "
                "could be the only one the grammar allows)")
    if (request.sampling_config.min_tokens or 0) > 0:
        return ("guided_decoding_params cannot be combined with sampling_config.min_tokens "
                "(the grammar decides where the output ends)")
    return None


def guided_request_error(request: Request, decoder: GuidedDecoder | None) -> str | None:
    """The executor's guided-decoding check of ``request`` (None when it passes)."""
    if request.guided_decoding_params is None:
        return None
    if decoder is None:
        return ("guided_decoding_params: guided decoding is off for this model (the executor "
                "has no guided_decoding_config: it needs the checkpoint's tokenizer.json and "
                "the xgrammar package)")
    return decoder.request_error(request)


def tokenizer_info(config: GuidedDecodingConfig, vocab_size: int) -> xgrammar.TokenizerInfo:
    """xgrammar's view of the tokenizer: the encoded vocabulary, its encoding (byte-level,
    byte-fallback or raw, detected from ``tokenizer_str`` as xgrammar does for Hugging Face
    tokenizers) and the model's vocabulary size."""
    import xgrammar

    vocab = list(config.encoded_vocab or [])
    if not vocab:
        raise ValueError("GuidedDecodingConfig.encoded_vocab is required")
    if len(vocab) > vocab_size:  # tokens the model cannot produce: left out of every grammar
        logger.warning("guided decoding: the tokenizer has %d tokens, the model %d; the ids "
                       "past the model's are ignored", len(vocab), vocab_size)
        vocab = vocab[:vocab_size]
    vocab_type, add_prefix_space = xgrammar.VocabType.RAW, False
    if config.tokenizer_str:
        try:
            metadata = xgrammar.TokenizerInfo._detect_metadata_from_hf(config.tokenizer_str)
            vocab_type = metadata["vocab_type"]
            add_prefix_space = bool(metadata["add_prefix_space"])
        except Exception:  # an unusual tokenizer.json: take the vocabulary as raw text
            logger.warning("guided decoding: cannot tell how tokenizer.json encodes its "
                           "vocabulary; taking the tokens as raw text", exc_info=True)
    return xgrammar.TokenizerInfo(vocab, vocab_type, vocab_size=vocab_size,
                                  stop_token_ids=list(config.stop_token_ids or []) or None,
                                  add_prefix_space=add_prefix_space)


__all__ = ["GuidedDecoder", "GuidedDecodingParams", "guided_request_error", "tokenizer_info"]
