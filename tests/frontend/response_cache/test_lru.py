"""ByteLRU: bounded by bytes, least recently used out first, oversized values refused."""

from __future__ import annotations

import threading

import pytest

from shoal.frontend.response_cache.lru import ByteLRU


def test_holds_values_until_their_bytes_exceed_the_capacity() -> None:
    lru: ByteLRU[str, int] = ByteLRU(100)
    assert lru.put("a", 1, 40) and lru.put("b", 2, 40)
    assert lru.used == 80 and len(lru) == 2
    assert lru.put("c", 3, 40)  # 120 > 100: the least recently used ("a") goes
    assert lru.get("a") is None
    assert (lru.get("b"), lru.get("c")) == (2, 3)
    assert lru.used == 80 and lru.evictions == 1


def test_get_makes_a_value_the_most_recently_used() -> None:
    lru: ByteLRU[str, int] = ByteLRU(100)
    lru.put("a", 1, 40)
    lru.put("b", 2, 40)
    assert lru.get("a") == 1  # "b" is now the oldest
    lru.put("c", 3, 40)
    assert "b" not in lru and "a" in lru and "c" in lru


def test_evicts_as_many_values_as_the_new_one_needs() -> None:
    lru: ByteLRU[str, int] = ByteLRU(100)
    for i in range(10):
        lru.put(str(i), i, 10)
    assert lru.put("big", -1, 95)
    assert not any(str(i) in lru for i in range(10))
    assert lru.used == 95 and lru.evictions == 10


def test_a_value_larger_than_the_capacity_is_refused_and_evicts_nothing() -> None:
    lru: ByteLRU[str, int] = ByteLRU(100)
    lru.put("a", 1, 60)
    assert not lru.put("huge", 2, 101)
    assert "huge" not in lru and lru.get("a") == 1 and lru.used == 60 and lru.evictions == 0


def test_putting_a_key_again_replaces_its_value_and_size() -> None:
    lru: ByteLRU[str, int] = ByteLRU(100)
    lru.put("a", 1, 60)
    lru.put("a", 2, 30)
    assert lru.get("a") == 2 and lru.used == 30 and len(lru) == 1 and lru.evictions == 0


def test_zero_capacity_holds_only_empty_values() -> None:
    lru: ByteLRU[str, int] = ByteLRU(0)
    assert not lru.put("a", 1, 1)
    assert lru.put("empty", 0, 0) and lru.get("empty") == 0


def test_negative_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        ByteLRU(-1)
    with pytest.raises(ValueError):
        ByteLRU[str, int](10).put("a", 1, -1)


def test_used_bytes_stay_within_capacity_under_threads() -> None:
    lru: ByteLRU[int, int] = ByteLRU(1000)

    def churn(base: int) -> None:
        for i in range(2000):
            lru.put(base + i, i, 7 + i % 13)
            lru.get(base + i // 2)

    threads = [threading.Thread(target=churn, args=(n * 10_000,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert lru.used <= 1000
    assert lru.used == sum(7 + (k % 10_000) % 13 for k in range(40_000) if k in lru)
