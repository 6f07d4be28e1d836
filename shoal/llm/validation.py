"""Checks a request must pass before it is queued. A request that fails gets one error
response naming the field at fault; other requests are not affected."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable

from shoal.llm.limits import Limits as Limits
from shoal.llm.logits.validation import logits_request_error
from shoal.llm.request import Request


def request_error(request: Request, limits: Limits) -> str | None:
    """The first problem with ``request``, as a message for the client, or None."""
    for check in (_tokens_error, _length_error, _sampling_error, _words_error,
                  logits_request_error):
        message = check(request, limits)
        if message is not None:
            return message
    return _capacity_error(request, limits)


def _ids_error(field: str, ids: Iterable[object], vocab_size: int) -> str | None:
    for position, value in enumerate(ids):
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            return f"{field}[{position}] must be an integer token id, got {value!r}"
        token = operator.index(value)
        if not 0 <= token < vocab_size:
            return (f"{field}[{position}] = {token} is not a token id of the model "
                    f"(vocabulary 0..{vocab_size - 1})")
    return None


def _tokens_error(request: Request, limits: Limits) -> str | None:
    if not request.input_token_ids:
        return "input_token_ids must not be empty"
    message = _ids_error("input_token_ids", request.input_token_ids, limits.vocab_size)
    if message is not None:
        return message
    for field, value in (("end_id", request.end_id), ("pad_id", request.pad_id)):
        if value is not None:
            message = _ids_error(field, [value], limits.vocab_size)
            if message is not None:
                return message.replace(f"{field}[0]", field)
    return None


def _length_error(request: Request, limits: Limits) -> str | None:
    if not isinstance(request.max_tokens, int) or request.max_tokens < 1:
        return f"max_tokens must be an integer >= 1, got {request.max_tokens!r}"
    total = len(request.input_token_ids) + request.max_tokens
    if total > limits.max_seq_len:
        return (f"input length {len(request.input_token_ids)} + max_tokens "
                f"{request.max_tokens} = {total} exceeds the maximum sequence length "
                f"{limits.max_seq_len}")
    return None


def _sampling_error(request: Request, limits: Limits) -> str | None:
    config = request.sampling_config
    width = config.beam_width
    if width < 1:
        return f"sampling_config.beam_width must be >= 1, got {width}"
    if width > limits.max_beam_width:
        return (f"sampling_config.beam_width {width} exceeds the executor's max_beam_width "
                f"{limits.max_beam_width}")
    count = request.effective_num_return_sequences
    if count < 1:
        return f"num_return_sequences must be >= 1, got {count}"
    if width > 1 and count > width:
        return f"num_return_sequences {count} exceeds sampling_config.beam_width {width}"
    checks = (
        ("temperature", config.temperature, lambda v: v >= 0.0, ">= 0"),
        ("top_k", config.top_k, lambda v: v >= 0, ">= 0"),
        ("top_p", config.top_p, lambda v: 0.0 <= v <= 1.0, "in [0, 1]"),
        ("repetition_penalty", config.repetition_penalty, lambda v: v > 0.0, "> 0"),
        ("min_tokens", config.min_tokens, lambda v: v >= 0, ">= 0"),
        ("early_stopping", config.early_stopping, lambda v: v in (-1, 0, 1), "-1, 0 or 1"),
        ("seed", config.seed, lambda v: v >= 0, ">= 0"),
    )
    for name, value, valid, rule in checks:
        if value is not None and not (math.isfinite(value) and valid(value)):
            return f"sampling_config.{name} must be {rule}, got {value}"
    for name, maybe in (("presence_penalty", config.presence_penalty),
                        ("frequency_penalty", config.frequency_penalty),
                        ("length_penalty", config.length_penalty)):
        if maybe is not None and not math.isfinite(maybe):
            return f"sampling_config.{name} must be finite, got {maybe}"
    return None


def _words_error(request: Request, limits: Limits) -> str | None:
    for field, words in (("bad_words", request.bad_words), ("stop_words", request.stop_words)):
        for index, word in enumerate(words or ()):
            if not word:
                return f"{field}[{index}] must not be empty"
            message = _ids_error(f"{field}[{index}]", word, limits.vocab_size)
            if message is not None:
                return message
    return None


def _capacity_error(request: Request, limits: Limits) -> str | None:
    width = max(request.sampling_config.beam_width, request.effective_num_return_sequences)
    total = len(request.input_token_ids) + request.max_tokens
    need = width * math.ceil(total / limits.tokens_per_block)
    if need > limits.num_blocks:
        return (f"the request needs up to {need} KV cache blocks ({width} sequence(s) of "
                f"{total} tokens) but the cache has {limits.num_blocks}; lower max_tokens, "
                f"beam_width or num_return_sequences")
    return None
