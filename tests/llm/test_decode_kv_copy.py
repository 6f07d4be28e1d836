"""The decode rows' keys/values kept between iterations (``decode_copy.DecodeKvCopy``): one slot
per decoding sequence. The attention output agrees with gathering every iteration (to float32
rounding: the kept slots are wider, with masked keys); a sequence keeps its slot while it decodes
one token further with its earlier blocks unchanged, new and changed sequences fill a slot from
the pool, leaving ones give theirs back."""

from __future__ import annotations

import pytest
import torch

from shoal.llm.attention import SequenceSpan, build_attention_batch, paged_attention
from shoal.llm.decode_copy import DecodeKvCopy, SlotPlan
from shoal.llm.kv_cache import BlockManager

BLOCK, KV_HEADS, HEADS, DIM, LAYERS = 4, 2, 4, 8, 2
TOKEN_BYTES = LAYERS * 2 * KV_HEADS * DIM * 4


class Row:
    """A stand-in Sequence: its identity and its block table."""

    def __init__(self, blocks: BlockManager, cached: int) -> None:
        self.table: list[int] = []
        blocks.prepare_write(self.table, 0, cached)
        self.cached = cached


def step(rows: list[Row], blocks: BlockManager, caches: list[torch.Tensor],
         copy: DecodeKvCopy | None) -> tuple[torch.Tensor, SlotPlan | None]:
    """One decode iteration of ``rows`` (each adds one token) over every layer; returns the
    layers' outputs stacked, and the kept copy's plan (None: not kept)."""
    spans = []
    for index, row in enumerate(rows):
        blocks.prepare_write(row.table, row.cached, 1)
        spans.append(SequenceSpan(index, 1, row.cached, row.table, row))
    batch = build_attention_batch(spans, blocks, "cpu", decode_copy=copy)
    outs = []
    for layer, cache in enumerate(caches):
        generator = torch.Generator().manual_seed(1000 * layer + sum(r.cached for r in rows))
        q = torch.randn(len(rows), HEADS, DIM, generator=generator)
        k = torch.randn(len(rows), KV_HEADS, DIM, generator=generator)
        v = torch.randn(len(rows), KV_HEADS, DIM, generator=generator)
        outs.append(paged_attention(q, k, v, cache, batch, 0.3, layer))
    for row in rows:
        row.cached += 1
    return torch.stack(outs), batch.decode_plan


def pools(blocks: BlockManager) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(2, blocks.num_blocks * BLOCK, KV_HEADS, DIM) for _ in range(LAYERS)]


def gathered(plan: SlotPlan | None) -> list[int]:
    assert plan is not None
    return [] if plan.gather_rows is None else plan.gather_rows.tolist()


def test_kept_slots_give_the_gathered_output_as_rows_join_and_leave() -> None:
    """Rows of different lengths cross block boundaries (the width grows), one leaves, two
    join; every iteration's output agrees with gathering from the pool."""
    runs = []
    for keep in (False, True):
        blocks = BlockManager(64, BLOCK)
        caches = pools(blocks)
        rows = [Row(blocks, cached) for cached in (5, 7, 2)]
        copy = DecodeKvCopy(TOKEN_BYTES) if keep else None
        outs = []
        for i in range(12):
            if i == 4:
                rows.pop(1)
            if i in (6, 9):
                rows.append(Row(blocks, 3 + i))
            outs.append(step(rows, blocks, caches, copy))
        runs.append(outs)
    for (plain, plain_plan), (kept, plan) in zip(*runs, strict=True):
        assert plain_plan is None and plan is not None
        torch.testing.assert_close(kept, plain, rtol=1e-5, atol=1e-6)
    # all rows at first; then only the rows that joined (at i = 6 and 9, appended last)
    assert [gathered(plan) for _, plan in runs[1]] == [
        [0, 1, 2], [], [], [], [], [], [2], [], [], [3], [], []]


def test_a_leaving_row_gives_its_slot_to_the_next_one() -> None:
    blocks = BlockManager(64, BLOCK)
    caches = pools(blocks)
    copy = DecodeKvCopy(TOKEN_BYTES)
    first, second = Row(blocks, 5), Row(blocks, 6)
    _, plan = step([first, second], blocks, caches, copy)
    assert plan is not None and plan.slots.tolist() == [0, 1]
    newcomer = Row(blocks, 2)
    _, plan = step([second, newcomer], blocks, caches, copy)  # first left: slot 0 is free
    assert plan is not None and plan.slots.tolist() == [1, 0] and gathered(plan) == [1]


def test_another_sequence_with_the_same_table_is_gathered_anew() -> None:
    blocks = BlockManager(32, BLOCK)
    caches = pools(blocks)
    copy = DecodeKvCopy(TOKEN_BYTES)
    first = Row(blocks, 5)
    step([first], blocks, caches, copy)
    stranger = Row.__new__(Row)  # same blocks and length, another sequence
    stranger.table, stranger.cached = first.table, first.cached
    _, plan = step([stranger], blocks, caches, copy)
    assert gathered(plan) == [0]
    _, plan = step([stranger], blocks, caches, copy)
    assert gathered(plan) == []


def test_a_row_whose_earlier_blocks_changed_is_gathered_anew() -> None:
    """A copied shared block (or any other change of a block already kept) refills the slot;
    a block appended at the end does not."""
    blocks = BlockManager(32, BLOCK)
    caches = pools(blocks)
    copy = DecodeKvCopy(TOKEN_BYTES)
    row = Row(blocks, 6)
    step([row], blocks, caches, copy)
    _, plan = step([row], blocks, caches, copy)  # position 7 ... 8 starts a block next
    assert gathered(plan) == []
    _, plan = step([row], blocks, caches, copy)
    assert gathered(plan) == [] and len(row.table) == 3
    replacement = next(b for b in range(blocks.num_blocks) if b not in row.table)
    row.table[0] = replacement
    _, plan = step([row], blocks, caches, copy)
    assert gathered(plan) == [0]


def test_mostly_idle_slots_start_over() -> None:
    blocks = BlockManager(128, BLOCK)
    caches = pools(blocks)
    copy = DecodeKvCopy(TOKEN_BYTES)
    rows = [Row(blocks, 3) for _ in range(20)]
    _, plan = step(rows, blocks, caches, copy)
    assert plan is not None and plan.capacity == 24
    _, plan = step(rows[:12], blocks, caches, copy)  # half the slots busy: kept
    assert plan is not None and plan.capacity == 24 and gathered(plan) == []
    _, plan = step(rows[:3], blocks, caches, copy)
    assert plan is not None and plan.capacity == 8 and gathered(plan) == [0, 1, 2]


def test_width_grows_with_headroom_and_outputs_stay_the_gathered_ones() -> None:
    """width_growth 2 (the compiled attention's setting): the slots start twice as wide as the
    rows need and double when a row outgrows them, so rows cross block boundaries without a
    copy each time; the outputs still equal gathering every iteration."""
    def world() -> tuple[BlockManager, list[torch.Tensor], list[Row]]:
        blocks = BlockManager(64, BLOCK)
        return blocks, pools(blocks), [Row(blocks, 3), Row(blocks, 2)]

    blocks, caches, rows = world()
    fresh_blocks, fresh_caches, fresh_rows = world()  # the same tables and pool contents
    copy = DecodeKvCopy(TOKEN_BYTES, width_growth=2.0)
    widths = []
    for _ in range(7):  # the longest row goes from 4 to 10 tokens
        kept, plan = step(rows, blocks, caches, copy)
        expected, _ = step(fresh_rows, fresh_blocks, fresh_caches, None)
        assert plan is not None
        widths.append(plan.width)
        assert torch.allclose(kept, expected, atol=1e-6)
    assert widths == [8, 8, 8, 8, 8, 24, 24]  # 1, 2 (x4), then 3 blocks of 4 tokens


def test_a_copy_too_large_is_not_kept() -> None:
    blocks = BlockManager(32, BLOCK)
    caches = pools(blocks)
    copy = DecodeKvCopy(10**9)  # every token "weighs" a gigabyte
    rows = [Row(blocks, 5)]
    step(rows, blocks, caches, copy)
    _, plan = step(rows, blocks, caches, copy)
    assert plan is None and not copy.layers


def test_a_skipped_row_mask_is_built_where_torch_ops_need_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """build_attention_batch(row_mask=False) leaves the padding mask to the compiled kernel; the
    torch path (kernels off) builds the same mask on demand and attends the same."""
    from shoal.llm.attention import decode_row_mask
    from shoal.llm.kernels import ENABLE_ENV

    monkeypatch.setenv(ENABLE_ENV, "0")
    torch.manual_seed(5)
    blocks = BlockManager(32, 4)
    cache = torch.randn(2, 32 * 4, 2, 8)
    spans = []
    for row, cached in enumerate((3, 9, 6)):
        table: list[int] = []
        blocks.prepare_write(table, 0, cached + 1)
        spans.append(SequenceSpan(row, 1, cached, table))
    full = build_attention_batch(spans, blocks, "cpu")
    lean = build_attention_batch(spans, blocks, "cpu", row_mask=False)
    assert full.decode_mask is not None and not full.row_mask_skipped
    assert lean.decode_mask is None and lean.row_mask_skipped
    built = decode_row_mask(lean, torch.float32)
    assert built is not None and torch.equal(built, full.decode_mask)
    query, key, value = torch.randn(3, 4, 8), torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    expected = paged_attention(query, key, value, cache.clone(), full, scale=0.4)
    assert torch.equal(paged_attention(query, key, value, cache.clone(), lean, scale=0.4),
                       expected)
