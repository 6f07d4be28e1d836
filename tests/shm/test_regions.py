from __future__ import annotations

import os

import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.shm.regions import RegionCache
from shoal.shm.segment import Segment


def _error(cache: RegionCache, region: str, offset: int, nbytes: int) -> ShoalError:
    with pytest.raises(ShoalError) as info:
        cache.view(region, offset, nbytes)
    assert info.value.code == ErrorCode.INTERNAL
    assert region not in info.value.message and "/shoal" not in info.value.message
    return info.value


def test_view_reads_the_owner_bytes_read_only(shm_prefix: str) -> None:
    with Segment.create(shm_prefix + "w-0", 4096) as owner:
        owner.buf[100:104] = b"abcd"
        cache = RegionCache(shm_prefix)
        view = cache.view(owner.name, 100, 4)
        assert bytes(view) == b"abcd" and view.readonly
        writable = cache.view(owner.name, 0, 2, readonly=False)
        writable[:] = b"zz"
        assert bytes(owner.buf[0:2]) == b"zz"
        assert len(cache) == 1 and cache.mapped_size(owner.name) == 4096
        assert cache.mapped_size(shm_prefix + "w-9") is None
        cache.close()
        assert os.path.exists("/dev/shm" + owner.name)  # the cache never unlinks


def test_bounds_are_checked_without_overflow(shm_prefix: str) -> None:
    with Segment.create(shm_prefix + "w-0", 4096) as owner:
        cache = RegionCache(shm_prefix)
        assert len(cache.view(owner.name, 0, 4096)) == 4096
        assert len(cache.view(owner.name, 4096, 0)) == 0
        _error(cache, owner.name, 1, 4096)
        _error(cache, owner.name, 4097, 0)
        _error(cache, owner.name, -1, 10)
        _error(cache, owner.name, 0, -1)
        _error(cache, owner.name, 2**64 - 1, 2)      # wraps to 1 in 64-bit arithmetic
        _error(cache, owner.name, 16, 2**64 - 8)     # offset + nbytes wraps to 8
        _error(cache, owner.name, 2**63, 2**63)
        cache.close()


def test_prefix_rule_refuses_foreign_segments(shm_prefix: str) -> None:
    with Segment.create(shm_prefix + "client", 4096) as foreign:
        cache = RegionCache(shm_prefix + "w-")
        _error(cache, foreign.name, 0, 1)
        assert len(cache) == 0


def test_missing_segment_is_an_internal_error(shm_prefix: str) -> None:
    cache = RegionCache(shm_prefix)
    _error(cache, shm_prefix + "gone", 0, 1)


def test_reattaches_once_when_the_owner_recreated_the_segment_bigger(shm_prefix: str) -> None:
    name = shm_prefix + "w-0"
    cache = RegionCache(shm_prefix)
    owner = Segment.create(name, 4096)
    assert len(cache.view(name, 0, 16)) == 16
    owner.close()
    bigger = Segment.create(name, 16384)
    bigger.buf[10000:10003] = b"new"
    assert bytes(cache.view(name, 10000, 3)) == b"new"
    bigger.close()
    cache.close()


def test_lru_evicts_and_closes_the_oldest(shm_prefix: str) -> None:
    owners = [Segment.create(f"{shm_prefix}w-{i}", 4096) for i in range(3)]
    cache = RegionCache(shm_prefix, max_regions=2)
    cache.view(owners[0].name, 0, 1)
    cache.view(owners[1].name, 0, 1)
    cache.view(owners[0].name, 0, 1)          # 0 is now the most recent
    kept_view = cache.view(owners[1].name, 0, 8)
    cache.view(owners[0].name, 0, 1)
    cache.view(owners[2].name, 0, 1)          # evicts 1, the least recent
    assert owners[1].name not in cache
    assert owners[0].name in cache and owners[2].name in cache
    owners[1].buf[0:8] = b"stillmap"
    assert bytes(kept_view) == b"stillmap"    # an evicted mapping lives on in its views
    cache.forget_prefix(shm_prefix + "w-2")
    assert owners[2].name not in cache and len(cache) == 1
    cache.forget(owners[0].name)
    assert len(cache) == 0
    for owner in owners:
        owner.close()


def test_an_attach_drops_the_mappings_of_unlinked_segments(shm_prefix: str) -> None:
    """A mapping of a segment its owner dropped would pin the memory: the next attach closes
    it; mappings of live segments stay."""
    live = Segment.create(shm_prefix + "w-live", 4096)
    dropped = Segment.create(shm_prefix + "w-dropped", 4096)
    newer = Segment.create(shm_prefix + "w-newer", 4096)
    cache = RegionCache(shm_prefix)
    cache.view(live.name, 0, 1)
    cache.view(dropped.name, 0, 1)
    assert dropped.linked()
    dropped.close()  # the owner unlinks it
    assert dropped.name in cache
    cache.view(live.name, 0, 1)  # cached: no attach, nothing checked
    assert dropped.name in cache
    cache.view(newer.name, 0, 1)
    assert dropped.name not in cache
    assert live.name in cache and newer.name in cache
    cache.close()
    live.close()
    newer.close()
