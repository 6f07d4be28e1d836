"""The decode rows' gathered keys/values kept between iterations (``attention.DecodeKvCopy``):
the attention output is bitwise the one of gathering every iteration; the copy is used only for
the same sequences, one token further, while the longest block table keeps its length (a row
whose table changed is gathered again)."""

from __future__ import annotations

import torch

from shoal.workers.llm.attention import (
    DecodeKvCopy,
    SequenceSpan,
    build_attention_batch,
    paged_attention,
)
from shoal.workers.llm.kv_cache import BlockManager

BLOCK, KV_HEADS, HEADS, DIM, LAYERS = 4, 2, 4, 8, 2


class Row:
    """A stand-in Sequence: its identity and its block table."""

    def __init__(self, blocks: BlockManager, cached: int) -> None:
        self.table: list[int] = []
        blocks.prepare_write(self.table, 0, cached)
        self.cached = cached


def step(rows: list[Row], blocks: BlockManager, caches: list[torch.Tensor],
         copy: DecodeKvCopy | None) -> tuple[torch.Tensor, bool]:
    """One decode iteration of ``rows`` (each adds one token) over every layer; returns the
    layers' outputs stacked, and whether the kept copy served it."""
    spans = []
    for index, row in enumerate(rows):
        blocks.prepare_write(row.table, row.cached, 1)
        spans.append(SequenceSpan(index, 1, row.cached, row.table, row))
    batch = build_attention_batch(spans, blocks, "cpu", decode_copy=copy)
    outs = []
    for layer, cache in enumerate(caches):
        generator = torch.Generator().manual_seed(1000 * layer + rows[0].cached)
        q = torch.randn(len(rows), HEADS, DIM, generator=generator)
        k = torch.randn(len(rows), KV_HEADS, DIM, generator=generator)
        v = torch.randn(len(rows), KV_HEADS, DIM, generator=generator)
        outs.append(paged_attention(q, k, v, cache, batch, 0.3, layer))
    for row in rows:
        row.cached += 1
    return torch.stack(outs), batch.decode_reused


def pools(blocks: BlockManager) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(2, blocks.num_blocks * BLOCK, KV_HEADS, DIM) for _ in range(LAYERS)]


def test_kept_copy_gives_the_gathered_output_bitwise() -> None:
    runs = []
    for keep in (False, True):
        blocks = BlockManager(32, BLOCK)
        caches = pools(blocks)
        rows = [Row(blocks, cached) for cached in (5, 7, 2)]
        copy = DecodeKvCopy(LAYERS * 2 * KV_HEADS * DIM * 4) if keep else None
        runs.append([step(rows, blocks, caches, copy) for _ in range(9)])
    for (plain, plain_reused), (kept, _) in zip(*runs, strict=True):
        assert torch.equal(plain, kept) and not plain_reused
    # positions 5+i, 7+i, 2+i in blocks of 4: the longest table grows at i = 1 and 5 (all rows
    # gathered anew); at i = 2, 3, 6, 7 a shorter row starts a block (that row gathered again)
    assert [reused for _, reused in runs[1]] == [False, False, True, True, True, False, True,
                                                 True, True]


def test_another_sequence_with_the_same_table_is_gathered_anew() -> None:
    blocks = BlockManager(32, BLOCK)
    caches = pools(blocks)
    copy = DecodeKvCopy(LAYERS * 2 * KV_HEADS * DIM * 4)
    first = Row(blocks, 5)
    step([first], blocks, caches, copy)
    stranger = Row.__new__(Row)  # same blocks and length, another sequence
    stranger.table, stranger.cached = first.table, first.cached
    _, reused = step([stranger], blocks, caches, copy)
    assert not reused
    _, reused = step([stranger], blocks, caches, copy)
    assert reused


def test_a_copy_too_large_is_not_kept() -> None:
    blocks = BlockManager(32, BLOCK)
    caches = pools(blocks)
    copy = DecodeKvCopy(10**9)  # every token "weighs" a gigabyte
    rows = [Row(blocks, 5)]
    step(rows, blocks, caches, copy)
    _, reused = step(rows, blocks, caches, copy)
    assert not reused and not copy.layers
