"""What one iteration's attention works from (``attention.py`` builds it, ``window.py`` narrows
it for a layer with a sliding window, the models read it): the packed sequences and the
``AttentionBatch`` shared by every layer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shoal.llm.decode_copy import DecodeKvCopy, SlotPlan


@dataclass(frozen=True)
class SequenceSpan:
    """One sequence of the packed batch: tokens [start, start + num_tokens) of the batch are its
    positions [cached, cached + num_tokens)."""

    start: int
    num_tokens: int
    cached: int
    block_table: list[int]
    owner: object | None = None  # the Sequence (``DecodeKvCopy`` matches rows by identity)


@dataclass(frozen=True)
class ExtendSpan:
    start: int  # packed [start, end) of the span's tokens
    end: int
    blocks: torch.Tensor  # [NB] the sequence's block table
    mask: torch.Tensor  # [1, 1, end - start, NB * tokens_per_block] True = attend
    cached: int = 0  # position of the span's first token (``window.py`` narrows the mask)


@dataclass(frozen=True)
class AttentionBatch:
    slot_mapping: torch.Tensor  # [T] pool slot each token's key/value is written to
    prefill_spans: list[tuple[int, int]]  # packed [start, end) of context spans
    decode_rows: torch.Tensor  # [Bd] packed index of each decode token
    decode_blocks: torch.Tensor  # [Bd, NB] block table of each decode row (padded with 0)
    decode_mask: torch.Tensor | None  # [Bd, 1, 1, NB * tokens_per_block] additive, in the
    # model's dtype: 0 = attend, -inf = padding; None when no row is padded. (SDPA's CPU kernel
    # turns a boolean mask into this itself on every call, at ~40% of a decode row's attention;
    # the result is bitwise the same.)
    tokens_per_block: int
    extend_spans: list[ExtendSpan] = field(default_factory=list)
    decode_copy: DecodeKvCopy | None = None  # kept keys/values of the decode rows, when kept
    decode_plan: SlotPlan | None = None  # where the decode rows live in decode_copy
    decode_only: bool = False  # every token is a decode row, in packed order (row i = token i)
    decode_lengths: tuple[int, ...] = ()  # keys each decode row attends to: its position + 1
    # one per prefill span when ``window.py`` cut one: the window's tile mask (additive
    # [1, 1, W, 2W - 1], ``window.tile_mask``) for a span longer than the window W, else None
    # (plain causal); () when no span is cut
    prefill_masks: tuple[torch.Tensor | None, ...] = ()
    decode_window: int = 0  # the sliding window ``decode_mask`` folds in (0: none), for the
    # compiled kernel, which skips the keys below it instead of reading a mask
    row_mask_skipped: bool = False  # padded decode rows but no decode_mask built (the compiled
    # kernel needs none); ``decode_row_mask`` builds it where torch ops need it after all
