"""How large an ``llm``-backend model's prompt may be, in bytes, before anything tokenizes it
(README "Faults and limits", "prompt size").

One rule for the two places that check it: the HTTP frontend (generate and the OpenAI API,
from the config it was pushed) and the llm backend in the worker (every request, whatever
protocol brought it). A prompt text (``text_input``, ``messages``, and the ``stop_words`` /
``bad_words`` together) longer than the limit is refused with INVALID_ARG naming the limit and
is never tokenized: tokenizing is the only request work whose cost grows with the text before
the token limit (the executor's maximum sequence length) can be checked.

The limit is the config parameter ``shoal_max_prompt_bytes`` when given (an integer >= 1),
else ``BYTES_PER_TOKEN`` bytes per token of the model's maximum sequence length. That bound is
generous (real tokenizers average 3-5 bytes per token), so a prompt it refuses would also be
refused by the token limit. The frontend reads the sequence length from the ``max_seq_len``
parameter, or, without one, uses ``FALLBACK_BYTES``; the worker knows the executor's real
length, so its limit may be the tighter one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

PARAMETER: Final = "shoal_max_prompt_bytes"
BYTES_PER_TOKEN: Final = 16
FALLBACK_BYTES: Final = 4 * 1024 * 1024  # BYTES_PER_TOKEN x 262144 tokens
_SEQ_LEN_PARAMETER: Final = "max_seq_len"


def configured_bytes(parameters: Mapping[str, str]) -> int | None:
    """The ``shoal_max_prompt_bytes`` parameter, None when not given. Raises ValueError with
    the message for the model's owner when it is not an integer >= 1."""
    text = parameters.get(PARAMETER, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"config parameter {PARAMETER} must be an integer, got "
                         f"'{text}'") from None
    if value < 1:
        raise ValueError(f"config parameter {PARAMETER} must be >= 1, got {value}")
    return value


def byte_limit(parameters: Mapping[str, str], max_seq_len: int | None) -> int:
    """The limit for a model with these parameters and (when known) maximum sequence length;
    a bad ``shoal_max_prompt_bytes`` raises ValueError (``configured_bytes``)."""
    configured = configured_bytes(parameters)
    if configured is not None:
        return configured
    return FALLBACK_BYTES if max_seq_len is None else BYTES_PER_TOKEN * max_seq_len


def frontend_byte_limit(parameters: Mapping[str, str]) -> int:
    """The frontend's limit: it knows only the config. A bad value counts as unset (the
    model's load refuses it)."""
    text = parameters.get(_SEQ_LEN_PARAMETER, "").strip()
    seq_len = int(text) if text.isdigit() and int(text) > 0 else None
    try:
        return byte_limit(parameters, seq_len)
    except ValueError:
        return byte_limit({}, seq_len)


def over_limit_message(what: str, size: int, limit: int) -> str:
    """The client's message: ``what`` names the input (e.g. ``input 'text_input'``)."""
    return (f"{what} holds {size} bytes, over this model's prompt limit of {limit} bytes "
            f"(config parameter {PARAMETER}, default {BYTES_PER_TOKEN} bytes per token of "
            f"the maximum sequence length); nothing was tokenized")
