"""Block reuse (TensorRT-LLM's ``enable_block_reuse``): which KV blocks hold which token prefix.

A full block is named by a key chained over the prefix it ends: ``key(i) = H(key(i-1), tokens
of block i)`` (BLAKE2b, 16 bytes; the first block chains from the empty key). Equal keys mean
equal token prefixes, so equal keys/values: a block's keys and values depend only on the tokens
at and before its positions. Partly filled blocks are never named (they are still written).

``PrefixIndex`` maps keys to blocks and keeps the named blocks that no sequence references any
more in least-recently-released order: they count as free and are handed out again (evicted,
oldest first, and forgotten) only when the pool has no never-named free block left.
Threads: executor loop thread only (through ``BlockManager``).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

ROOT_KEY = b""


def chain_key(parent: bytes, tokens: list[int]) -> bytes:
    """The key of a full block holding ``tokens`` after the prefix named ``parent``."""
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(array("q", tokens).tobytes())
    return digest.digest()


def extend_keys(keys: list[bytes], tokens: list[int], tokens_per_block: int,
                num_blocks: int) -> None:
    """Grow ``keys`` (the chain of the first ``len(keys)`` blocks of ``tokens``, mutated) to the
    first ``num_blocks`` full blocks (``num_blocks * tokens_per_block <= len(tokens)``)."""
    while len(keys) < num_blocks:
        index = len(keys)
        block = tokens[index * tokens_per_block:(index + 1) * tokens_per_block]
        keys.append(chain_key(keys[-1] if keys else ROOT_KEY, block))


class PrefixIndex:
    def __init__(self) -> None:
        self._block_of: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # oldest release first

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    @property
    def num_named(self) -> int:
        return len(self._key_of)

    def lookup(self, key: bytes) -> int | None:
        return self._block_of.get(key)

    def is_named(self, block: int) -> bool:
        return block in self._key_of

    def is_evictable(self, block: int) -> bool:
        return block in self._evictable

    def name(self, block: int, key: bytes) -> None:
        """Record that ``block`` (referenced, full, never written again) holds ``key``'s prefix.
        A key already held by another block, or a block already named, is left as it is."""
        if key in self._block_of or block in self._key_of:
            return
        self._block_of[key] = block
        self._key_of[block] = key

    def park(self, block: int) -> None:
        """A named block lost its last reference: reusable, and the most recently released."""
        self._evictable[block] = None

    def unpark(self, block: int) -> None:
        """A parked block is referenced again (reused)."""
        del self._evictable[block]

    def evict_oldest(self) -> int | None:
        """Forget the least recently released parked block and hand it out; None when none."""
        if not self._evictable:
            return None
        block, _ = self._evictable.popitem(last=False)
        del self._block_of[self._key_of.pop(block)]
        return block
