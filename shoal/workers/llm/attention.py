"""Attention over block tables, with plain torch ops.

One iteration packs the tokens of every scheduled sequence into one [T, ...] batch (the linear
layers see all of them at once). Attention then treats two kinds of sequence:

- context (prefill) spans: a sequence computed from position 0 in this iteration (a new or a
  resumed request); causal attention over its own keys, which are also written to the cache;
- decode rows: a sequence adding one token after ``cached`` cached ones; its query attends to
  the keys of positions [0, cached], gathered from the pool a whole block at a time through
  its block table. Rows are padded to the longest table and masked;
- extend spans: a sequence adding several tokens after ``cached`` cached ones (a context chunk,
  or the rest of a prompt whose prefix came from reused blocks); its queries attend to the
  gathered keys of positions [0, cached + i] (query i), one span at a time.

``AttentionBatch`` is built once per iteration and shared by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from shoal.workers.llm.kv_cache import BlockManager


@dataclass(frozen=True)
class SequenceSpan:
    """One sequence of the packed batch: tokens [start, start + num_tokens) of the batch are its
    positions [cached, cached + num_tokens)."""

    start: int
    num_tokens: int
    cached: int
    block_table: list[int]


@dataclass(frozen=True)
class ExtendSpan:
    start: int  # packed [start, end) of the span's tokens
    end: int
    blocks: torch.Tensor  # [NB] the sequence's block table
    mask: torch.Tensor  # [1, 1, end - start, NB * tokens_per_block] True = attend


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


def build_attention_batch(spans: list[SequenceSpan], blocks: BlockManager,
                          device: torch.device | str,
                          dtype: torch.dtype = torch.float32) -> AttentionBatch:
    """``dtype``: the model's (queries', keys') dtype, that of the additive decode mask."""
    slot_mapping: list[int] = []
    prefill: list[tuple[int, int]] = []
    decode_rows: list[int] = []
    decode_tables: list[list[int]] = []
    decode_lengths: list[int] = []
    extend: list[ExtendSpan] = []
    for span in spans:
        slot_mapping += blocks.slots(span.block_table, span.cached, span.num_tokens)
        if span.cached == 0:
            prefill.append((span.start, span.start + span.num_tokens))
        elif span.num_tokens == 1:
            decode_rows.append(span.start)
            decode_tables.append(span.block_table)
            decode_lengths.append(span.cached + 1)
        else:
            extend.append(_extend_span(span, blocks.tokens_per_block, device))
    size = blocks.tokens_per_block
    width = max((len(t) for t in decode_tables), default=0)
    mask: torch.Tensor | None = None
    if any(length != width * size for length in decode_lengths):
        lengths = torch.tensor(decode_lengths, device=device)
        keys = torch.arange(width * size, device=device)
        padding = (keys[None, :] >= lengths[:, None])[:, None, None, :]
        mask = torch.zeros(padding.shape, dtype=dtype, device=device).masked_fill_(
            padding, float("-inf"))
    padded = [t + [0] * (width - len(t)) for t in decode_tables]
    return AttentionBatch(
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.long, device=device),
        prefill_spans=prefill,
        decode_rows=torch.tensor(decode_rows, dtype=torch.long, device=device),
        decode_blocks=torch.tensor(padded, dtype=torch.long,
                                   device=device).reshape(len(padded), width),
        decode_mask=mask,
        tokens_per_block=size,
        extend_spans=extend,
    )


def _extend_span(span: SequenceSpan, tokens_per_block: int,
                 device: torch.device | str) -> ExtendSpan:
    width = len(span.block_table) * tokens_per_block
    keys = torch.arange(width, device=device)
    last_key = torch.arange(span.cached, span.cached + span.num_tokens, device=device)
    return ExtendSpan(
        start=span.start, end=span.start + span.num_tokens,
        blocks=torch.tensor(span.block_table, dtype=torch.long, device=device),
        mask=(keys[None, :] <= last_key[:, None])[None, None])


def paged_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    layer_cache: torch.Tensor, batch: AttentionBatch,
                    scale: float) -> torch.Tensor:
    """query [T, H, D], key/value [T, Hkv, D] of this iteration's tokens; ``layer_cache``
    [2 (key, value), slots, Hkv, D] of one layer (written here). Returns [T, H, D]. H must be a
    multiple of Hkv (grouped-query attention: query head h reads key/value head
    h // (H // Hkv))."""
    layer_cache[0].index_copy_(0, batch.slot_mapping, key)
    layer_cache[1].index_copy_(0, batch.slot_mapping, value)
    gqa = query.shape[1] != key.shape[1]
    out = torch.empty_like(query)
    for start, end in batch.prefill_spans:
        q = query[start:end].transpose(0, 1)[None]
        k = key[start:end].transpose(0, 1)[None]
        v = value[start:end].transpose(0, 1)[None]
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                  enable_gqa=gqa)
        out[start:end] = attended[0].transpose(0, 1)
    if batch.decode_rows.numel():
        q = query[batch.decode_rows][:, :, None, :]  # [Bd, H, 1, D]
        k, v = _gather_blocks(layer_cache, batch)  # [Bd, Hkv, K, D] each
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=batch.decode_mask,
                                                  scale=scale, enable_gqa=gqa)
        out[batch.decode_rows] = attended[:, :, 0, :]
    for span in batch.extend_spans:
        q = query[span.start:span.end].transpose(0, 1)[None]  # [1, H, n, D]
        k, v = _gather_table(layer_cache, span.blocks, batch.tokens_per_block)
        attended = F.scaled_dot_product_attention(q, k[None], v[None], attn_mask=span.mask,
                                                  scale=scale, enable_gqa=gqa)
        out[span.start:span.end] = attended[0].transpose(0, 1)
    return out


def _gather_table(layer_cache: torch.Tensor, table: torch.Tensor,
                  tokens_per_block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[2, slots, Hkv, D] cache -> keys and values [Hkv, NB * tokens_per_block, D] of one
    block table."""
    _, slots, heads, dim = layer_cache.shape
    by_block = layer_cache.view(2, slots // tokens_per_block, tokens_per_block, heads, dim)
    gathered = torch.index_select(by_block, 1, table)
    keys, values = gathered.view(2, -1, heads, dim).transpose(1, 2).unbind(0)
    return keys, values


def _gather_blocks(layer_cache: torch.Tensor,
                   batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """[2, slots, Hkv, D] cache -> keys and values [Bd, Hkv, NB * tokens_per_block, D] of each
    decode row."""
    _, slots, heads, dim = layer_cache.shape
    size = batch.tokens_per_block
    by_block = layer_cache.view(2, slots // size, size, heads, dim)
    rows, width = batch.decode_blocks.shape
    # index_select copies whole blocks; much faster on CPU than advanced indexing
    gathered = torch.index_select(by_block, 1, batch.decode_blocks.reshape(-1))
    keys, values = gathered.view(2, rows, width * size, heads, dim).transpose(2, 3).unbind(0)
    return keys, values
