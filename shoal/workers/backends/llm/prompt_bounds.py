"""Bounded request work before the executor (README "Faults and limits", "prompt size").

Contracts:

- ``PromptBounds.check_bytes`` refuses a prompt text over the byte limit
  (``config/prompt_limits.py``) before it is decoded or tokenized; ``check_tokens`` refuses a
  token-id prompt (``input_ids``) longer than the maximum sequence length before its ids are
  turned into Python ints. Both raise INVALID_ARG naming the limit.
- ``encode`` tokenizes with the GIL released for the whole call: the ``tokenizers`` binding's
  ``encode`` holds the GIL until it returns (a 10 MiB prompt held it for 7-18 s, measured with a
  thread ticking every 50 ms), which stopped the worker's control thread and so its heartbeat;
  ``encode_batch`` releases it (the same ticking thread saw gaps of under 0.2 s), so the
  heartbeat, the executor's loop and its streams go on while a big prompt is tokenized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shoal.config import prompt_limits
from shoal.errors import invalid_arg

if TYPE_CHECKING:
    from tokenizers import Tokenizer


@dataclass(frozen=True)
class PromptBounds:
    max_bytes: int
    max_tokens: int  # the executor's maximum sequence length

    def check_bytes(self, what: str, size: int) -> None:
        """``what``: the input, as the client names it (e.g. ``input 'text_input'``)."""
        if size > self.max_bytes:
            raise invalid_arg(prompt_limits.over_limit_message(what, size, self.max_bytes))

    def check_tokens(self, name: str, count: int) -> None:
        if count > self.max_tokens:
            raise invalid_arg(f"input '{name}' holds {count} token ids, over the maximum "
                              f"sequence length {self.max_tokens} of this model")


UNBOUNDED = PromptBounds(max_bytes=1 << 62, max_tokens=1 << 62)  # callers without a model


def read_bounds(parameters: dict[str, str], max_seq_len: int) -> PromptBounds:
    """The model's bounds; a bad ``shoal_max_prompt_bytes`` raises INVALID_ARG (at load)."""
    try:
        max_bytes = prompt_limits.byte_limit(parameters, max_seq_len)
    except ValueError as exc:
        raise invalid_arg(f"llm backend: {exc}") from None
    return PromptBounds(max_bytes, max_seq_len)


def element_size(item: Any) -> int:
    """The byte size of one element of a BYTES input (numpy object array: bytes or str)."""
    return len(item) if isinstance(item, bytes) else len(str(item).encode())


def encode(tokenizer: Tokenizer, text: str, add_special_tokens: bool = True) -> list[int]:
    """``tokenizer.encode(text).ids`` with the GIL released (module doc)."""
    encoding = tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0]
    ids: list[int] = encoding.ids
    return ids
