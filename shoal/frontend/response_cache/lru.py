"""A least-recently-used map bounded by bytes, not entries.

Contract: every value is stored with its size (``nbytes``, what it costs to keep); the sum of
the sizes held never exceeds ``capacity``. ``put`` evicts the least recently used values until
the new one fits; a value larger than the whole capacity is refused (``put`` returns False) and
evicts nothing. ``get`` makes a value the most recently used.

Threads: every method takes one lock and never blocks on anything else, so the map may be used
from the event loop and from other threads alike; on the event loop each call is atomic (no
await inside).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ByteLRU(Generic[K, V]):
    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be 0 or more, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._used = 0
        self._evictions = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        """Bytes held now."""
        return self._used

    @property
    def evictions(self) -> int:
        """Values evicted to make room since the map was made (replacements not counted)."""
        return self._evictions

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: K) -> bool:
        """Membership without touching the recency order."""
        return key in self._entries

    def get(self, key: K) -> V | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            return found[0]

    def put(self, key: K, value: V, nbytes: int) -> bool:
        """Hold ``value`` as the most recently used; False (nothing changed) when ``nbytes``
        exceeds the capacity."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be 0 or more, got {nbytes}")
        with self._lock:
            if nbytes > self.capacity:
                return False
            old = self._entries.pop(key, None)
            if old is not None:
                self._used -= old[1]
            while self._used + nbytes > self.capacity:
                _, (_, size) = self._entries.popitem(last=False)
                self._used -= size
                self._evictions += 1
            self._entries[key] = (value, nbytes)
            self._used += nbytes
            return True

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._used = 0
