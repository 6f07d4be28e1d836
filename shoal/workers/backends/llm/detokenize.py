"""Incremental detokenization: text pieces of a token stream that never split a character.

A byte-level tokenizer may spread one UTF-8 character over several tokens; decoding the tokens
seen so far then ends in U+FFFD. ``IncrementalDetokenizer`` holds such a tail back until the
tokens that complete it arrive. Each step decodes a short window (from ``prefix`` to the end)
and emits what it adds to the window's already-emitted text, so decoders that depend on the
previous token (SentencePiece's leading space) join pieces correctly, in linear time overall.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, context: list[int] | None = None) -> None:
        """``context``: tokens that precede the stream (the prompt) and are not emitted; they
        give the first generated tokens the neighbours they are decoded with."""
        self._tokenizer = tokenizer
        self._tokens: list[int] = list(context or [])[-4:]
        self._prefix = 0  # start of the window decoded at each step
        self._read = len(self._tokens)  # tokens up to here are emitted

    def push(self, tokens: list[int]) -> str:
        """The text ``tokens`` complete (maybe ""; a partial character waits)."""
        self._tokens.extend(tokens)
        prefix_text = self._decode(self._prefix, self._read)
        text = self._decode(self._prefix, len(self._tokens))
        if len(text) <= len(prefix_text) or text.endswith(_REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self._tokens)
        return text[len(prefix_text):]

    def flush(self) -> str:
        """At the end of the stream: whatever is held back (an incomplete character decodes
        to U+FFFD, as a full decode would)."""
        prefix_text = self._decode(self._prefix, self._read)
        text = self._decode(self._prefix, len(self._tokens))
        self._prefix = self._read = len(self._tokens)
        return text[len(prefix_text):] if len(text) > len(prefix_text) else ""

    def _decode(self, start: int, end: int) -> str:
        text: str = self._tokenizer.decode(self._tokens[start:end], skip_special_tokens=True)
        return text
