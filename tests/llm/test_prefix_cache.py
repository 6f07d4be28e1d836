"""Block reuse bookkeeping: the hash chain, naming, reuse, LRU eviction and copy-on-write (no
model, no tensors)."""

from __future__ import annotations

from shoal.llm.kv_cache import BlockManager
from shoal.llm.prefix_cache import ROOT_KEY, chain_key, extend_keys

SIZE = 4


def keys_of(tokens: list[int]) -> list[bytes]:
    keys: list[bytes] = []
    extend_keys(keys, tokens, SIZE, len(tokens) // SIZE)
    return keys


def computed(blocks: BlockManager, tokens: list[int]) -> list[int]:
    """A sequence whose ``tokens`` were computed: its table, full blocks named."""
    table: list[int] = []
    blocks.prepare_write(table, 0, len(tokens))
    keys = keys_of(tokens)
    blocks.name_blocks(table, keys, 0, len(keys))
    return table


def test_chain_key_names_the_whole_prefix_not_only_the_block() -> None:
    a = keys_of([1, 2, 3, 4, 5, 6, 7, 8])
    b = keys_of([9, 2, 3, 4, 5, 6, 7, 8])
    assert a[0] == chain_key(ROOT_KEY, [1, 2, 3, 4]) and a[1] == chain_key(a[0], [5, 6, 7, 8])
    assert a[0] != b[0] and a[1] != b[1]  # same second block, different prefix
    assert keys_of([1, 2, 3, 4, 5, 6, 7, 8, 9]) == a  # a partial block has no key
    grown = a[:1]
    extend_keys(grown, [1, 2, 3, 4, 5, 6, 7, 8], SIZE, 2)
    assert grown == a  # growing the chain equals computing it at once


def test_released_named_blocks_stay_reusable_and_count_as_free() -> None:
    blocks = BlockManager(8, SIZE, enable_reuse=True)
    prompt = list(range(10, 20))  # 2 full blocks + 2 tokens
    table = computed(blocks, prompt)
    first_two = table[:2]
    blocks.release(table)
    assert blocks.free_blocks == 8 and blocks.used_blocks == 0
    assert blocks.reusable_blocks == 2  # the partial block is not named

    again: list[int] = []
    prefix = blocks.cached_prefix(keys_of(prompt))
    assert prefix == first_two and blocks.attach_demand(prefix) == 2
    blocks.attach(again, prefix, context_blocks=3)
    assert again == first_two and blocks.reusable_blocks == 0 and blocks.free_blocks == 6
    assert (blocks.reused_blocks, blocks.missed_blocks) == (2, 1)
    assert blocks.cache_hit_rate == 2 / 3
    # a different prompt shares nothing
    assert blocks.cached_prefix(keys_of(list(range(30, 40)))) == []


def test_shared_prefix_is_refcounted_and_freed_by_the_last_owner() -> None:
    blocks = BlockManager(8, SIZE, enable_reuse=True)
    prompt = list(range(8))
    owner = computed(blocks, prompt)
    reader: list[int] = []
    blocks.attach(reader, blocks.cached_prefix(keys_of(prompt)), context_blocks=2)
    assert reader == owner and all(blocks.refcount(b) == 2 for b in owner)
    assert blocks.attach_demand(reader) == 0  # referenced blocks cost no free block
    blocks.release(owner)
    assert blocks.reusable_blocks == 0 and blocks.used_blocks == 2
    blocks.release(reader)
    assert blocks.reusable_blocks == 2 and blocks.used_blocks == 0


def test_reuse_off_names_nothing_and_finds_nothing() -> None:
    blocks = BlockManager(8, SIZE)
    prompt = list(range(8))
    blocks.release(computed(blocks, prompt))
    assert blocks.reusable_blocks == 0 and blocks.cached_prefix(keys_of(prompt)) == []


def test_short_pool_evicts_least_recently_released_tail_first() -> None:
    blocks = BlockManager(4, SIZE, enable_reuse=True)
    old, new = list(range(100, 108)), list(range(200, 208))
    old_table = computed(blocks, old)
    blocks.release(old_table)  # released first: the oldest
    blocks.release(computed(blocks, new))
    assert blocks.reusable_blocks == 4 and blocks.free_blocks == 4

    taken: list[int] = []
    blocks.prepare_write(taken, 0, 1)  # no never-named block left: evict one
    assert blocks.reusable_blocks == 3
    # the old chain lost its tail, not its head: a shorter prompt still hits
    assert len(blocks.cached_prefix(keys_of(old))) == 1
    assert len(blocks.cached_prefix(keys_of(new))) == 2
    blocks.prepare_write(taken, 1, SIZE)  # one more block: the old head goes
    assert blocks.cached_prefix(keys_of(old)) == []
    assert len(blocks.cached_prefix(keys_of(new))) == 2


def test_reusing_a_block_makes_it_recently_used() -> None:
    blocks = BlockManager(4, SIZE, enable_reuse=True)
    first, second = list(range(100, 108)), list(range(200, 208))
    blocks.release(computed(blocks, first))
    blocks.release(computed(blocks, second))
    table: list[int] = []
    blocks.attach(table, blocks.cached_prefix(keys_of(first)), context_blocks=2)
    blocks.release(table)  # ``first`` is now the most recently released
    taken: list[int] = []
    blocks.prepare_write(taken, 0, 2 * SIZE)
    assert len(blocks.cached_prefix(keys_of(first))) == 2
    assert blocks.cached_prefix(keys_of(second)) == []


def test_a_key_held_by_another_block_is_not_renamed() -> None:
    blocks = BlockManager(8, SIZE, enable_reuse=True)
    prompt = list(range(8))
    first = computed(blocks, prompt)
    duplicate = computed(blocks, prompt)  # computed concurrently, before any reuse
    assert blocks.cached_prefix(keys_of(prompt)) == first
    blocks.release(duplicate)
    assert blocks.reusable_blocks == 0  # unnamed duplicates go straight back to the free list
    blocks.release(first)
    assert blocks.reusable_blocks == 2


def test_writes_after_a_reused_prefix_never_touch_shared_blocks() -> None:
    blocks = BlockManager(8, SIZE, enable_reuse=True)
    prompt = list(range(8))
    owner = computed(blocks, prompt)
    reader: list[int] = []
    blocks.attach(reader, blocks.cached_prefix(keys_of(prompt)), context_blocks=3)
    # the reader's own tokens go to a fresh block; full shared blocks are never copied
    assert blocks.prepare_write(reader, 2 * SIZE, 3) == []
    assert reader[:2] == owner and reader[2] not in owner
    assert all(s // SIZE == reader[2] for s in blocks.slots(reader, 2 * SIZE, 3))
    # a fork of the reader shares its partial block: the first writer copies it
    child = blocks.fork(reader)
    copies = blocks.prepare_write(child, 2 * SIZE + 3, 1)
    assert copies == [(reader[2], child[2])] and child[:2] == owner
