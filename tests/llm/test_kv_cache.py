from __future__ import annotations

import pytest
import torch

from shoal.llm.kv_cache import BlockManager, KvCachePool
from shoal.workers.workspace import WorkspacePool


def test_prepare_write_appends_blocks_and_maps_slots() -> None:
    blocks = BlockManager(num_blocks=8, tokens_per_block=4)
    table: list[int] = []
    assert blocks.write_demand(table, 0, 6) == 2
    assert blocks.prepare_write(table, 0, 6) == []
    assert len(table) == 2 and blocks.free_blocks == 6
    assert blocks.slots(table, 3, 3) == [table[0] * 4 + 3, table[1] * 4 + 0, table[1] * 4 + 1]
    # position 6 still fits in the second block; position 8 needs a third
    assert blocks.write_demand(table, 6, 1) == 0
    assert blocks.write_demand(table, 6, 3) == 1


def test_fork_shares_blocks_and_copies_the_partial_block_on_write() -> None:
    blocks = BlockManager(num_blocks=8, tokens_per_block=4)
    parent: list[int] = []
    blocks.prepare_write(parent, 0, 6)  # one full block + 2 tokens in the second
    child = blocks.fork(parent)
    assert child == parent and all(blocks.refcount(b) == 2 for b in parent)
    assert blocks.write_demand(child, 6, 1) == 1  # shared partial block must be copied
    copies = blocks.prepare_write(child, 6, 1)
    assert copies == [(parent[1], child[1])] and child[1] != parent[1]
    assert child[0] == parent[0] and blocks.refcount(parent[0]) == 2
    assert blocks.refcount(parent[1]) == 1
    # the parent is now the only owner of its partial block: writing needs no copy
    assert blocks.write_demand(parent, 6, 1) == 0 and blocks.prepare_write(parent, 6, 1) == []


def test_full_shared_blocks_are_never_copied() -> None:
    blocks = BlockManager(num_blocks=8, tokens_per_block=4)
    parent: list[int] = []
    blocks.prepare_write(parent, 0, 8)
    child = blocks.fork(parent)
    assert blocks.write_demand(child, 8, 1) == 1  # a new block, no copy
    assert blocks.prepare_write(child, 8, 1) == []
    assert child[:2] == parent[:2]


def test_release_returns_blocks_only_when_the_last_owner_lets_go() -> None:
    blocks = BlockManager(num_blocks=4, tokens_per_block=2)
    parent: list[int] = []
    blocks.prepare_write(parent, 0, 4)
    child = blocks.fork(parent)
    blocks.release(parent)
    assert parent == [] and blocks.free_blocks == 2
    blocks.release(child)
    assert blocks.free_blocks == 4 and blocks.used_blocks == 0


def test_exhausted_pool_raises_and_counts_allocations() -> None:
    blocks = BlockManager(num_blocks=2, tokens_per_block=2)
    blocks.start_iteration()
    table: list[int] = []
    blocks.prepare_write(table, 0, 4)
    assert blocks.alloc_new_blocks == 2 and blocks.alloc_total_blocks == 2
    with pytest.raises(RuntimeError, match="no free block"):
        blocks.prepare_write(table, 4, 1)


def test_table_that_does_not_match_its_cached_tokens_is_refused() -> None:
    blocks = BlockManager(num_blocks=4, tokens_per_block=2)
    with pytest.raises(RuntimeError, match="does not match"):
        blocks.write_demand([], 3, 1)


def test_pool_copy_blocks_copies_every_layer_key_and_value() -> None:
    pool = KvCachePool.allocate(num_layers=2, num_kv_heads=1, head_dim=2, num_blocks=3,
                                tokens_per_block=2, dtype=torch.float32, device="cpu")
    pool.storage[:, :, 0:2] = torch.arange(16, dtype=torch.float32).view(2, 2, 2, 1, 2)
    pool.copy_blocks([(0, 2)])
    assert torch.equal(pool.storage[:, :, 4:6], pool.storage[:, :, 0:2])
    assert torch.count_nonzero(pool.storage[:, :, 2:4]) == 0


def test_pool_is_carved_from_the_worker_workspace() -> None:
    workspace = WorkspacePool("cpu", 1 << 16)
    pool = KvCachePool.allocate(num_layers=2, num_kv_heads=2, head_dim=4, num_blocks=4,
                                tokens_per_block=4, dtype=torch.float32, device="cpu",
                                workspace=workspace)
    assert workspace.used_bytes >= pool.nbytes and workspace.fallback_allocations == 0
    assert pool.layer(1).shape == (2, 16, 2, 4)
