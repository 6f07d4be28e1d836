"""Paged KV cache: one preallocated pool of fixed-size blocks, and the bookkeeping over it.

``BlockManager`` is pure bookkeeping (no torch): a free list, a reference count per block, and
the operations on per-sequence block tables (lists of block ids, position ``p`` of a sequence
lives in block ``table[p // tokens_per_block]`` at offset ``p % tokens_per_block``). Sequences of
one request (beams, returned sequences) share blocks by ``fork``; a shared block is copied
before it is written (copy-on-write, reported by ``prepare_write`` as (src, dst) pairs that the
caller applies to the pool). Invariant of every table: it holds exactly the blocks of the
sequence's cached tokens, ``len(table) == blocks_for_tokens(num_cached)``.

With block reuse on (``enable_reuse``), full blocks are named by the token prefix they end
(``prefix_cache.py``); a new sequence starts from the blocks of its longest named prefix
(``cached_prefix`` + ``attach``, shared and refcounted like forks), and a named block whose last
reference goes stays in the pool, counted free, until an allocation finds no never-named free
block and evicts the least recently released one. Tables are released last block first, so a
chain's tail is evicted before its head (a head without its tail still serves shorter prompts).

``KvCachePool`` owns the tensor: ``[num_layers, 2 (key, value), num_blocks * tokens_per_block,
num_kv_heads, head_dim]``, allocated once (or carved from the worker's ``WorkspacePool``); the
hot path only indexes into it. Threads: both are used by the executor loop thread only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from shoal.llm.prefix_cache import PrefixIndex

if TYPE_CHECKING:
    import torch


class DeviceWorkspace(Protocol):
    """What the KV pool needs of the worker's device workspace (``workers/workspace.py``'s
    ``WorkspacePool``): a tensor carved from it, or a fresh one when it is exhausted."""

    def take(self, nbytes: int, dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor: ...


class BlockManager:
    def __init__(self, num_blocks: int, tokens_per_block: int, *,
                 enable_reuse: bool = False) -> None:
        if num_blocks < 1 or tokens_per_block < 1:
            raise ValueError(f"need >= 1 block of >= 1 token, got {num_blocks} blocks of "
                             f"{tokens_per_block}")
        self.num_blocks = num_blocks
        self.tokens_per_block = tokens_per_block
        self.enable_reuse = enable_reuse
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self._refs = [0] * num_blocks
        self._index = PrefixIndex()
        self.alloc_total_blocks = 0
        self.alloc_new_blocks = 0  # since the last ``start_iteration``
        self.reused_blocks = 0  # context blocks found named (attached), since the start
        self.missed_blocks = 0  # context blocks not found (computed), since the start

    @property
    def free_blocks(self) -> int:
        """Blocks an allocation can take: never named ones plus named ones nobody references."""
        return len(self._free) + self._index.num_evictable

    @property
    def reusable_blocks(self) -> int:
        """Named blocks nobody references (free, but kept for reuse until evicted)."""
        return self._index.num_evictable

    @property
    def cache_hit_rate(self) -> float:
        looked_up = self.reused_blocks + self.missed_blocks
        return self.reused_blocks / looked_up if looked_up else 0.0

    @property
    def used_blocks(self) -> int:
        """Blocks some sequence references."""
        return self.num_blocks - self.free_blocks

    def refcount(self, block: int) -> int:
        return self._refs[block]

    def start_iteration(self) -> None:
        self.alloc_new_blocks = 0

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.tokens_per_block)

    def write_demand(self, table: list[int], num_cached: int, num_new: int) -> int:
        """Blocks that writing positions [num_cached, num_cached + num_new) would take from the
        free list: new blocks at the end, plus one when the partly filled last block is shared
        (an upper bound when several sequences share it: the last writer copies nothing)."""
        if num_new <= 0:
            return 0
        grow = self.blocks_for_tokens(num_cached + num_new) - len(table)
        return grow + (1 if self._last_block_is_shared(table, num_cached) else 0)

    def prepare_write(self, table: list[int], num_cached: int,
                      num_new: int) -> list[tuple[int, int]]:
        """Make positions [num_cached, num_cached + num_new) writable in ``table`` (mutated):
        copy a shared partly filled last block, append new blocks. Returns the block copies
        (src, dst) the pool must perform before the write. Raises RuntimeError when the free
        list runs dry (the scheduler checks ``write_demand`` first)."""
        copies: list[tuple[int, int]] = []
        if num_new <= 0:
            return copies
        if self._last_block_is_shared(table, num_cached):
            shared = table[-1]
            fresh = self._allocate()
            self._refs[shared] -= 1
            table[-1] = fresh
            copies.append((shared, fresh))
        while len(table) < self.blocks_for_tokens(num_cached + num_new):
            table.append(self._allocate())
        return copies

    def slots(self, table: list[int], start: int, count: int) -> list[int]:
        """Flat pool slots (block * tokens_per_block + offset) of positions [start, start+count)."""
        size = self.tokens_per_block
        return [table[p // size] * size + p % size for p in range(start, start + count)]

    def fork(self, table: list[int]) -> list[int]:
        for block in table:
            self._refs[block] += 1
        return list(table)

    def release(self, table: list[int]) -> None:
        """Drop the table's references, last block first (blocks nobody else holds go back to
        the free list, or, when named, to the reusable ones) and empty it."""
        for block in reversed(table):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if self._index.is_named(block):
                    self._index.park(block)
                else:
                    self._free.append(block)
            elif self._refs[block] < 0:
                raise RuntimeError(f"KV block {block} released more often than referenced")
        table.clear()

    # --- block reuse ---

    def cached_prefix(self, keys: list[bytes]) -> list[int]:
        """Blocks holding the longest prefix of the chain ``keys`` (nothing is taken; [] with
        reuse off)."""
        found: list[int] = []
        if not self.enable_reuse:
            return found
        for key in keys:
            block = self._index.lookup(key)
            if block is None:
                break
            found.append(block)
        return found

    def attach_demand(self, blocks: list[int]) -> int:
        """Free blocks that ``attach`` of ``blocks`` takes: those nobody references now."""
        return sum(1 for block in blocks if self._refs[block] == 0)

    def attach(self, table: list[int], blocks: list[int], context_blocks: int) -> None:
        """Start the empty ``table`` with the named ``blocks`` (from ``cached_prefix``), shared.
        ``context_blocks``: blocks of the whole context being looked up (the rest are counted
        as missed)."""
        if table:
            raise RuntimeError("a cached prefix can only start an empty block table")
        for block in blocks:
            if self._refs[block] == 0:
                self._index.unpark(block)
            self._refs[block] += 1
            table.append(block)
        self.reused_blocks += len(blocks)
        self.missed_blocks += max(0, context_blocks - len(blocks))

    def name_blocks(self, table: list[int], keys: list[bytes], start: int, end: int) -> None:
        """Name ``table[i]`` by ``keys[i]`` for ``start <= i < end``: full blocks whose
        keys/values are computed (never written again)."""
        if not self.enable_reuse:
            return
        for index in range(start, end):
            self._index.name(table[index], keys[index])

    def _last_block_is_shared(self, table: list[int], num_cached: int) -> bool:
        if len(table) != self.blocks_for_tokens(num_cached):
            raise RuntimeError(f"block table of {len(table)} blocks does not match "
                               f"{num_cached} cached tokens")
        return num_cached % self.tokens_per_block != 0 and self._refs[table[-1]] > 1

    def _allocate(self) -> int:
        if self._free:
            block = self._free.pop()
        else:
            evicted = self._index.evict_oldest()
            if evicted is None:
                raise RuntimeError("KV cache pool has no free block")
            block = evicted
        self._refs[block] = 1
        self.alloc_total_blocks += 1
        self.alloc_new_blocks += 1
        return block


class KvCachePool:
    def __init__(self, storage: torch.Tensor, tokens_per_block: int) -> None:
        """``storage``: [num_layers, 2, num_blocks * tokens_per_block, num_kv_heads, head_dim]."""
        self.storage = storage
        self.tokens_per_block = tokens_per_block
        self.num_blocks = storage.shape[2] // tokens_per_block

    @classmethod
    def allocate(cls, *, num_layers: int, num_kv_heads: int, head_dim: int, num_blocks: int,
                 tokens_per_block: int, dtype: torch.dtype, device: str,
                 workspace: DeviceWorkspace | None = None) -> KvCachePool:
        import torch

        shape = (num_layers, 2, num_blocks * tokens_per_block, num_kv_heads, head_dim)
        if workspace is not None:
            nbytes = math.prod(shape) * dtype.itemsize
            storage = workspace.take(nbytes, dtype, shape)
        else:
            storage = torch.empty(shape, dtype=dtype, device=device)
        storage.zero_()
        return cls(storage, tokens_per_block)

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()

    def layer(self, index: int) -> torch.Tensor:
        """One layer's cache, a [2 (key, value), slots, num_kv_heads, head_dim] view."""
        return self.storage[index]

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        if not copies:
            return
        import torch

        size = self.tokens_per_block
        offsets = torch.arange(size, device=self.storage.device)
        src = torch.tensor([s for s, _ in copies], device=self.storage.device)
        dst = torch.tensor([d for _, d in copies], device=self.storage.device)
        src_slots = (src[:, None] * size + offsets).reshape(-1)
        dst_slots = (dst[:, None] * size + offsets).reshape(-1)
        self.storage[:, :, dst_slots] = self.storage[:, :, src_slots]
