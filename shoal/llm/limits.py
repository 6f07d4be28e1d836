"""What an executor can serve, as the request checks need it (``validation.py`` and the rooms'
own checks, e.g. ``logits/validation.py``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    vocab_size: int
    max_beam_width: int
    max_seq_len: int
    num_blocks: int
    tokens_per_block: int
    logits_post_processors: frozenset[str] = frozenset()  # names a request may give
