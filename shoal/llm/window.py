"""Sliding-window attention (Mistral, Qwen2/Qwen3 "sliding_attention" layers) as masks on an
``AttentionBatch``.

Semantics are Hugging Face's (``masking_utils.sliding_window_overlay`` on top of the causal
mask): a query at position p attends to the keys of positions (p - window, p], i.e. the
``window`` latest positions including its own. The paged cache keeps every position's key and
value; a window only narrows what each query sees:

- decode rows: ``decode_mask`` gains -inf for keys below the window (the kernel reads the
  additive mask as it is; it becomes non-None as soon as a window cuts some row);
- prefill spans longer than the window: attended in tiles of ``window`` queries, each over the
  keys of its window (``windowed_prefill_attention``), with one additive [W, 2W - 1] mask shared
  by every tile, so memory and work grow with n * W, not n * n;
- extend spans: their boolean mask loses the keys below the window.

Nothing is built when the window cuts nothing (every query's position < window): the layer then
gets the very same ``AttentionBatch`` and runs exactly as without a window.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from shoal.llm.attention_batch import AttentionBatch, ExtendSpan


def layer_batches(batch: AttentionBatch, windows: Sequence[int | None],
                  dtype: torch.dtype) -> list[AttentionBatch]:
    """The batch each layer attends with: ``batch`` itself for a layer without a window (None)
    or one the window does not cut, else a copy with the window folded into its masks (one copy
    per distinct window, shared by its layers). ``dtype``: the model's, that of the additive
    masks."""
    narrowed: dict[int, AttentionBatch] = {}
    out = []
    for window in windows:
        if window is None:
            out.append(batch)
            continue
        if window not in narrowed:
            narrowed[window] = windowed(batch, window, dtype)
        out.append(narrowed[window])
    return out


def windowed(batch: AttentionBatch, window: int, dtype: torch.dtype) -> AttentionBatch:
    """``batch`` with every query limited to the keys of its ``window`` latest positions;
    ``batch`` itself when no query of it is at a position >= ``window``."""
    decode_mask = _decode_mask(batch, window, dtype)
    device = batch.slot_mapping.device
    prefill_masks = tuple(tile_mask(window, dtype, device) if end - start > window else None
                          for start, end in batch.prefill_spans)
    extend = [_extend_span(span, window) for span in batch.extend_spans]
    prefill_cut = any(mask is not None for mask in prefill_masks)
    if (decode_mask is batch.decode_mask and not prefill_cut
            and all(new is old for new, old in zip(extend, batch.extend_spans, strict=True))):
        return batch
    return dataclasses.replace(batch, decode_mask=decode_mask, extend_spans=extend,
                               prefill_masks=prefill_masks if prefill_cut else (),
                               decode_window=window if decode_mask is not batch.decode_mask
                               else batch.decode_window,
                               # a window's mask also hides the padding
                               row_mask_skipped=batch.row_mask_skipped
                               and decode_mask is batch.decode_mask)


def _decode_mask(batch: AttentionBatch, window: int,
                 dtype: torch.dtype) -> torch.Tensor | None:
    """A row attending to ``length`` keys (positions [0, length)) keeps [length - window,
    length); ``batch.decode_mask`` itself when no row is that long."""
    lengths = batch.decode_lengths
    if not lengths or max(lengths) <= window:
        return batch.decode_mask
    device = batch.decode_blocks.device
    keys = torch.arange(batch.decode_blocks.shape[1] * batch.tokens_per_block, device=device)
    ends = torch.tensor(lengths, device=device)[:, None]
    hidden = (keys[None, :] >= ends) | (keys[None, :] < ends - window)
    return torch.zeros(hidden.shape, dtype=dtype, device=device).masked_fill_(
        hidden, float("-inf"))[:, None, None, :]


@functools.lru_cache(maxsize=8)
def tile_mask(window: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive [1, 1, W, 2W - 1] mask of a tile of W = ``window`` queries at positions
    [a, a + W) over the keys of positions [a - W + 1, a + W): query t sees key j iff
    t <= j <= t + W - 1 (causal, and within the window). Kept between iterations (read only)."""
    queries = torch.arange(window, device=device)[:, None]
    keys = torch.arange(2 * window - 1, device=device)[None, :]
    hidden = (keys < queries) | (keys > queries + window - 1)
    return torch.zeros(hidden.shape, dtype=dtype, device=device).masked_fill_(
        hidden, float("-inf"))[None, None]


def windowed_prefill_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               mask: torch.Tensor, scale: float, gqa: bool) -> torch.Tensor:
    """Causal attention of a span of positions [0, n) limited to the window W of ``mask``
    (``tile_mask``): query [1, H, n, D], key/value [1, Hkv, n, D]; returns [1, H, n, D]. Tiles
    of W queries each attend to their 2W - 1 latest keys (fewer at the span's start)."""
    window = mask.shape[-2]
    length = query.shape[2]
    out = query.new_empty(query.shape)
    for first in range(0, length, window):
        last = min(first + window, length)
        lowest = max(0, first - window + 1)  # the tile's first visible key
        offset = lowest - (first - window + 1)  # mask column of that key
        tile = mask[..., :last - first, offset:offset + last - lowest]
        out[:, :, first:last] = F.scaled_dot_product_attention(
            query[:, :, first:last], key[:, :, lowest:last], value[:, :, lowest:last],
            attn_mask=tile, scale=scale, enable_gqa=gqa)
    return out


def _extend_span(span: ExtendSpan, window: int) -> ExtendSpan:
    """The span with keys more than ``window - 1`` positions before each query masked out;
    ``span`` itself when its last position is below ``window``."""
    count = span.end - span.start
    if span.cached + count <= window:
        return span
    device = span.mask.device
    keys = torch.arange(span.mask.shape[-1], device=device)
    first_key = torch.arange(span.cached, span.cached + count, device=device) - (window - 1)
    return dataclasses.replace(span, mask=span.mask & (keys[None, :] >= first_key[:, None]))
