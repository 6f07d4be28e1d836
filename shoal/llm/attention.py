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

``AttentionBatch`` is built once per iteration and shared by every layer; a layer with a sliding
window gets a copy whose masks also hide the keys outside the window (``window.py``).

Gathering the decode rows' blocks copies every cached key and value of the batch once per layer
and iteration; ``DecodeKvCopy`` (``decode_copy.py``) keeps them between iterations, one slot per
decoding sequence, so an iteration writes only its new tokens (and fills the slots of sequences
that joined).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shoal.llm.attention_batch import AttentionBatch as AttentionBatch
from shoal.llm.attention_batch import ExtendSpan as ExtendSpan
from shoal.llm.attention_batch import SequenceSpan as SequenceSpan
from shoal.llm.decode_copy import DecodeKvCopy, SlotPlan
from shoal.llm.kernels import cpu_kernels, usable_rows
from shoal.llm.kv_cache import BlockManager
from shoal.llm.window import windowed_prefill_attention


def build_attention_batch(spans: list[SequenceSpan], blocks: BlockManager,
                          device: torch.device | str,
                          dtype: torch.dtype = torch.float32,
                          decode_copy: DecodeKvCopy | None = None,
                          row_mask: bool = True) -> AttentionBatch:
    """``dtype``: the model's (queries', keys') dtype, that of the additive decode mask.
    ``decode_copy``: the engine's kept decode keys/values (None: gather every iteration).
    ``row_mask`` False: the decode rows' padding mask is left unbuilt (the compiled kernel reads
    each row's length instead; five torch ops per iteration saved)."""
    slot_mapping: list[int] = []
    prefill: list[tuple[int, int]] = []
    decode_rows: list[int] = []
    decode_tables: list[list[int]] = []
    decode_lengths: list[int] = []
    decode_spans: list[SequenceSpan] = []
    extend: list[ExtendSpan] = []
    for span in spans:
        slot_mapping += blocks.slots(span.block_table, span.cached, span.num_tokens)
        if span.cached == 0:
            prefill.append((span.start, span.start + span.num_tokens))
        elif span.num_tokens == 1:
            decode_spans.append(span)
            decode_rows.append(span.start)
            decode_tables.append(span.block_table)
            decode_lengths.append(span.cached + 1)
        else:
            extend.append(_extend_span(span, blocks.tokens_per_block, device))
    size = blocks.tokens_per_block
    width = max((len(t) for t in decode_tables), default=0)
    mask: torch.Tensor | None = None
    padded_rows = any(length != width * size for length in decode_lengths)
    if padded_rows and row_mask:
        mask = _padding_mask(decode_lengths, width * size, dtype, device)
    padded = [t + [0] * (width - len(t)) for t in decode_tables]
    plan: SlotPlan | None = None
    if decode_copy is not None:
        if decode_spans:
            plan = decode_copy.plan([s.owner for s in decode_spans],
                                    [s.cached for s in decode_spans], decode_tables,
                                    width * size, device)
        else:
            decode_copy.forget()
    return AttentionBatch(
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.long, device=device),
        prefill_spans=prefill,
        decode_rows=torch.tensor(decode_rows, dtype=torch.long, device=device),
        decode_blocks=torch.tensor(padded, dtype=torch.long,
                                   device=device).reshape(len(padded), width),
        decode_mask=mask,
        tokens_per_block=size,
        extend_spans=extend,
        decode_copy=decode_copy if plan is not None else None,
        decode_plan=plan,
        decode_lengths=tuple(decode_lengths),
        decode_only=bool(decode_spans) and not prefill and not extend,
        row_mask_skipped=padded_rows and not row_mask,
    )


def _padding_mask(lengths: list[int] | tuple[int, ...], width: int, dtype: torch.dtype,
                  device: torch.device | str) -> torch.Tensor:
    """Additive [rows, 1, 1, width]: 0 for the keys below each row's length, -inf after."""
    ends = torch.tensor(lengths, device=device)
    keys = torch.arange(width, device=device)
    padding = (keys[None, :] >= ends[:, None])[:, None, None, :]
    return torch.zeros(padding.shape, dtype=dtype, device=device).masked_fill_(
        padding, float("-inf"))


def decode_row_mask(batch: AttentionBatch, dtype: torch.dtype) -> torch.Tensor | None:
    """``batch.decode_mask``, built now when ``build_attention_batch`` skipped it."""
    if not batch.row_mask_skipped:
        return batch.decode_mask
    width = batch.decode_blocks.shape[1] * batch.tokens_per_block
    return _padding_mask(batch.decode_lengths, width, dtype, batch.decode_blocks.device)


def _extend_span(span: SequenceSpan, tokens_per_block: int,
                 device: torch.device | str) -> ExtendSpan:
    width = len(span.block_table) * tokens_per_block
    keys = torch.arange(width, device=device)
    last_key = torch.arange(span.cached, span.cached + span.num_tokens, device=device)
    return ExtendSpan(
        start=span.start, end=span.start + span.num_tokens,
        blocks=torch.tensor(span.block_table, dtype=torch.long, device=device),
        mask=(keys[None, :] <= last_key[:, None])[None, None], cached=span.cached)


def paged_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    layer_cache: torch.Tensor, batch: AttentionBatch,
                    scale: float, layer: int = -1) -> torch.Tensor:
    """query [T, H, D], key/value [T, Hkv, D] of this iteration's tokens; ``layer_cache``
    [2 (key, value), slots, Hkv, D] of one layer (written here), ``layer`` its index (the key
    of ``batch.decode_copy``; -1: not kept). Returns [T, H, D]. H must be a multiple of Hkv
    (grouped-query attention: query head h reads key/value head h // (H // Hkv))."""
    kernels = cpu_kernels() if usable_rows(query, key, value) else None
    if kernels is not None and layer_cache.is_contiguous():
        kernels.store_kv(key, value, batch.slot_mapping, layer_cache)
    else:
        layer_cache[0].index_copy_(0, batch.slot_mapping, key)
        layer_cache[1].index_copy_(0, batch.slot_mapping, value)
    if batch.decode_only:  # the common decoding iteration: no packing in or out
        return _decode_rows(query, key, value, layer_cache, batch, layer, scale)
    gqa = query.shape[1] != key.shape[1]
    out = torch.empty_like(query)
    for index, (start, end) in enumerate(batch.prefill_spans):
        q = query[start:end].transpose(0, 1)[None]
        k = key[start:end].transpose(0, 1)[None]
        v = value[start:end].transpose(0, 1)[None]
        mask = batch.prefill_masks[index] if batch.prefill_masks else None
        if mask is None:
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                                      enable_gqa=gqa)
        else:
            attended = windowed_prefill_attention(q, k, v, mask, scale, gqa)
        out[start:end] = attended[0].transpose(0, 1)
    if batch.decode_rows.numel():
        rows = batch.decode_rows
        out[rows] = _decode_rows(query[rows], key[rows], value[rows], layer_cache, batch,
                                 layer, scale)
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


def decode_attention(query: torch.Tensor, keys_t: torch.Tensor, values: torch.Tensor,
                     mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """One query row per sequence: query [Bd, H, D], keys_t [Bd, Hkv, D, K] (keys transposed,
    contiguous), values [Bd, Hkv, K, D] (contiguous), ``mask`` additive [Bd, 1, 1, K] or None;
    returns [Bd, H, D].

    Grouped-query attention as two batched matmuls over (row, key-value head): the H // Hkv
    query heads that share a key-value head are the rows of one small matrix, so no key or
    value is repeated per query head, and the keys are kept transposed so the first product
    reads both operands contiguously. On the CPU this takes about half the time of SDPA's
    flash kernel with a single query row (which walks blocks of keys per query head); the
    result agrees with it to float32 rounding, not bitwise (the oracle compares tokens with
    Hugging Face). Softmax runs in float32 for half-precision models, as Hugging Face's eager
    attention does."""
    rows, heads, dim = query.shape
    kv_heads, width = values.shape[1], values.shape[2]
    group = heads // kv_heads
    scores = torch.bmm((query * scale).view(rows * kv_heads, group, dim),
                       keys_t.view(rows * kv_heads, dim, width))
    if mask is not None:
        scores.view(rows, kv_heads, group, width).add_(mask)
    if scores.dtype == torch.float32:
        probs = torch.softmax(scores, dim=-1)
    else:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)
    attended = torch.bmm(probs, values.view(rows * kv_heads, width, dim))
    return attended.view(rows, heads, dim)


def _decode_rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 layer_cache: torch.Tensor, batch: AttentionBatch, layer: int,
                 scale: float) -> torch.Tensor:
    """Attention of the decode rows (query [Bd, H, D], their new key/value [Bd, Hkv, D]) over
    their sequences' keys: in the kept slots of ``batch.decode_copy`` when kept (``layer`` >= 0),
    else gathered from the pool."""
    kept, plan = batch.decode_copy, batch.decode_plan
    if kept is None or plan is None or layer < 0:
        keys_t, values = _gather_blocks(layer_cache, batch)
        return decode_attention(query, keys_t, values, decode_row_mask(batch, query.dtype),
                                scale)
    keys_t, values = kept_slots(layer_cache, batch, layer)
    kernels = cpu_kernels() if usable_rows(query, key, value) else None
    if kernels is not None:  # writes the new keys/values and attends, unmasked, in one call
        return kernels.decode_attention(query, key, value, keys_t, values, plan.slots,
                                        plan.positions, batch.decode_window, scale)
    keys_t[plan.slots, :, :, plan.positions] = key
    values[plan.slots, :, plan.positions] = value
    mask = kept.slot_mask(plan, decode_row_mask(batch, query.dtype), batch.decode_lengths,
                          query.dtype)
    if plan.identity:
        return decode_attention(query, keys_t, values, mask, scale)
    slotted = query.new_zeros((plan.capacity, *query.shape[1:])).index_copy_(0, plan.slots, query)
    return decode_attention(slotted, keys_t, values, mask, scale).index_select(0, plan.slots)


def kept_slots(layer_cache: torch.Tensor, batch: AttentionBatch,
               layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's kept keys (transposed) and values for this iteration's decode rows
    (``batch.decode_copy`` and ``decode_plan`` set), grown to the plan and with the slots of
    new (or changed) sequences filled from ``layer_cache``; each row's new token is not
    written yet."""
    kept, plan = batch.decode_copy, batch.decode_plan
    assert kept is not None and plan is not None
    _, _, heads, dim = layer_cache.shape
    keys_t, values = kept.tensors(layer, plan, heads, dim, layer_cache.dtype, layer_cache.device)
    if plan.gather_rows is not None:  # new sequences (or changed ones) fill their slots
        fresh_keys_t, fresh_values = _gather_blocks(layer_cache, batch, plan.gather_rows)
        width = fresh_values.shape[2]
        keys_t[plan.gather_slots, :, :, :width] = fresh_keys_t
        values[plan.gather_slots, :, :width] = fresh_values
    return keys_t, values


def _gather_blocks(layer_cache: torch.Tensor, batch: AttentionBatch,
                   rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[2, slots, Hkv, D] cache -> the decode rows' keys, transposed [Bd, Hkv, D, K], and
    values [Bd, Hkv, K, D], K = NB * tokens_per_block (each contiguous: what
    ``decode_attention`` multiplies); only the decode rows ``rows`` when given."""
    _, slots, heads, dim = layer_cache.shape
    size = batch.tokens_per_block
    by_block = layer_cache.view(2, slots // size, size, heads, dim)
    tables = batch.decode_blocks if rows is None else batch.decode_blocks[rows]
    count, width = tables.shape
    # index_select copies whole blocks; much faster on CPU than advanced indexing
    gathered = torch.index_select(by_block, 1, tables.reshape(-1))
    keys, values = gathered.view(2, count, width * size, heads, dim).unbind(0)
    return (keys.permute(0, 2, 3, 1).contiguous(), values.transpose(1, 2).contiguous())
