from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.shm.arena import Arena, Slot
from shoal.shm.segment import Segment

SEGMENT = 64 * 1024


def _exists(name: str) -> bool:
    return os.path.exists("/dev/shm" + name)


@pytest.fixture
def arena(shm_prefix: str) -> Iterator[Arena]:
    created = Arena(shm_prefix + "fe-1-", SEGMENT, 4 * SEGMENT)
    yield created
    created.close()


def test_slot_is_a_writable_view_of_exactly_nbytes(arena: Arena, shm_prefix: str) -> None:
    slot = arena.allocate(100)
    assert isinstance(slot, Slot)
    assert slot.region == shm_prefix + "fe-1-0"
    assert slot.nbytes == 100 and len(slot.view) == 100 and not slot.view.readonly
    slot.view[:] = b"x" * 100
    reader = Segment.attach(slot.region, readonly=True)
    assert bytes(reader.buf[slot.offset:slot.offset + 100]) == b"x" * 100
    reader.close()
    assert arena.used_bytes == 128  # rounded to the 64-byte slot alignment


def test_segments_are_created_lazily(shm_prefix: str) -> None:
    lazy = Arena(shm_prefix + "w-m-1-", SEGMENT, SEGMENT)
    assert lazy.segment_names == [] and lazy.reserved_bytes == 0
    lazy.allocate(1)
    assert lazy.segment_names == [shm_prefix + "w-m-1-0"]
    lazy.close()


def test_grows_to_a_new_segment_when_the_first_is_full(arena: Arena, shm_prefix: str) -> None:
    first = arena.allocate(SEGMENT)
    second = arena.allocate(10)
    assert first.region == shm_prefix + "fe-1-0"
    assert second.region == shm_prefix + "fe-1-1"
    assert arena.reserved_bytes == 2 * SEGMENT
    arena.free(first)
    assert arena.allocate(10).region == shm_prefix + "fe-1-0"  # first fit prefers segment 0


def test_free_then_reuse(arena: Arena) -> None:
    slots = [arena.allocate(1000) for _ in range(10)]
    used = arena.used_bytes
    middle = slots[4]
    arena.free(middle)
    assert arena.used_bytes == used - 1024
    again = arena.allocate(1000)
    assert (again.region, again.offset) == (middle.region, middle.offset)
    arena.free_at(again.region, again.offset)
    with pytest.raises(KeyError):
        arena.free_at(again.region, again.offset)  # double free
    with pytest.raises(KeyError):
        arena.free_at("/shoal-test-other-0", 0)


def test_oversize_request_gets_a_dedicated_segment_kept_on_free(shm_prefix: str) -> None:
    arena = Arena(shm_prefix + "keep-", SEGMENT, 16 * SEGMENT)  # keeps up to a quarter
    small = arena.allocate(10)
    big = arena.allocate(SEGMENT + 1)
    assert big.region not in (small.region,)
    assert big.offset == 0 and len(big.view) == SEGMENT + 1
    assert _exists(big.region)
    size = arena.reserved_bytes - SEGMENT
    assert size > SEGMENT
    arena.free(big)
    # kept for reuse: still there, counted as reserved and kept, no slot in use
    assert _exists(big.region) and big.region in arena.segment_names
    assert arena.kept_bytes == size and arena.reserved_bytes == SEGMENT + size
    assert arena.used_bytes == 64
    again = arena.allocate(SEGMENT + 100)  # about the same size: the same segment
    assert (again.region, again.offset) == (big.region, 0)
    assert arena.kept_bytes == 0
    arena.free(again)
    with pytest.raises(KeyError):
        arena.free_at(again.region, 0)  # a kept segment holds no slot: double free
    arena.close()


def test_without_keeping_a_dedicated_segment_is_unlinked_on_free(shm_prefix: str) -> None:
    plain = Arena(shm_prefix + "nokeep-", SEGMENT, 4 * SEGMENT, keep_bytes=0)
    big = plain.allocate(SEGMENT + 1)
    plain.free(big)
    assert not _exists(big.region)
    assert big.region not in plain.segment_names and plain.reserved_bytes == 0
    # names are never reused while the arena lives
    assert plain.allocate(SEGMENT + 1).region != big.region
    plain.close()


def test_kept_segments_serve_only_requests_of_about_their_size(shm_prefix: str) -> None:
    arena = Arena(shm_prefix + "fit-", SEGMENT, 32 * SEGMENT, keep_bytes=16 * SEGMENT)
    big = arena.allocate(8 * SEGMENT)
    arena.free(big)
    smaller = arena.allocate(2 * SEGMENT)  # would waste 3/4 of the kept one: a new segment
    assert smaller.region != big.region
    larger = arena.allocate(8 * SEGMENT + 1)  # does not fit the kept one
    assert larger.region not in (big.region, smaller.region)
    close = arena.allocate(7 * SEGMENT)  # within a quarter of its size: reused
    assert close.region == big.region
    arena.close()


def test_kept_segments_are_bounded_oldest_dropped_first(shm_prefix: str) -> None:
    arena = Arena(shm_prefix + "bound-", SEGMENT, 64 * SEGMENT, keep_bytes=7 * SEGMENT)
    same = [arena.allocate(2 * SEGMENT) for _ in range(3)]
    for slot in same:
        arena.free(slot)
    # at most KEEP_PER_SIZE of one size: the oldest went
    assert [_exists(s.region) for s in same] == [False, True, True]
    assert arena.kept_bytes == 4 * SEGMENT
    other = arena.allocate(3 * SEGMENT)
    arena.free(other)
    # 4 + 3 = 7 segments' worth fits the cap
    assert arena.kept_bytes == 7 * SEGMENT and _exists(other.region)
    last = arena.allocate(3 * SEGMENT)  # reuses `other`
    assert last.region == other.region
    bigger = arena.allocate(4 * SEGMENT)
    arena.free(last)
    arena.free(bigger)  # 4 + 3 + 4 > 7: the oldest kept (same[1], same[2]) make room
    assert [_exists(s.region) for s in same] == [False, False, False]
    assert _exists(other.region) and _exists(bigger.region)
    assert arena.kept_bytes == 7 * SEGMENT
    too_big = arena.allocate(8 * SEGMENT)  # larger than the whole cap: never kept
    arena.free(too_big)
    assert not _exists(too_big.region)
    assert arena.reserved_bytes == arena.kept_bytes == 7 * SEGMENT
    arena.close()


def test_kept_segments_make_room_before_the_arena_is_full(shm_prefix: str) -> None:
    arena = Arena(shm_prefix + "room-", SEGMENT, 4 * SEGMENT, keep_bytes=2 * SEGMENT)
    big = arena.allocate(2 * SEGMENT)
    arena.free(big)
    assert arena.kept_bytes == 2 * SEGMENT
    held = [arena.allocate(SEGMENT) for _ in range(4)]  # needs the kept memory back
    assert not _exists(big.region) and arena.kept_bytes == 0
    assert arena.reserved_bytes == 4 * SEGMENT
    for slot in held:
        arena.free(slot)
    arena.close()


def test_close_unlinks_kept_segments(shm_prefix: str) -> None:
    arena = Arena(shm_prefix + "close-", SEGMENT, 32 * SEGMENT)
    kept = [arena.allocate(2 * SEGMENT), arena.allocate(3 * SEGMENT)]
    for slot in kept:
        arena.free(slot)
    assert all(_exists(slot.region) for slot in kept)
    arena.close()
    assert not any(_exists(slot.region) for slot in kept)
    assert arena.kept_bytes == 0 and arena.reserved_bytes == 0


def test_full_arena_raises_unavailable(arena: Arena) -> None:
    held = [arena.allocate(SEGMENT) for _ in range(4)]
    with pytest.raises(ShoalError) as info:
        arena.allocate(1)
    assert info.value.code == ErrorCode.UNAVAILABLE
    assert info.value.message.startswith("shared-memory arena is full: ")
    assert "/shoal" not in info.value.message
    with pytest.raises(ShoalError) as not_now:
        arena.allocate(2 * SEGMENT)  # could fit once slots are freed: retryable
    assert not_now.value.code == ErrorCode.UNAVAILABLE
    with pytest.raises(ShoalError) as too_big:
        arena.allocate(4 * SEGMENT + 1)  # can never fit: the client's to fix
    assert too_big.value.code == ErrorCode.INVALID_ARG
    assert "--shm-arena-byte-size" in too_big.value.message
    assert "/shoal" not in too_big.value.message
    arena.free(held[2])
    assert arena.allocate(1).region == held[2].region


def test_idle_segments_make_room_for_a_dedicated_one(arena: Arena) -> None:
    burst = [arena.allocate(SEGMENT) for _ in range(4)]
    for slot in burst:
        arena.free(slot)
    assert arena.reserved_bytes == 4 * SEGMENT
    big = arena.allocate(2 * SEGMENT)  # fits only once empty segments are given back
    assert len(big.view) == 2 * SEGMENT
    assert arena.reserved_bytes <= 4 * SEGMENT


def test_close_unlinks_every_segment_and_is_idempotent(arena: Arena) -> None:
    arena.allocate(SEGMENT)
    arena.allocate(SEGMENT)
    arena.allocate(3 * SEGMENT // 2)
    names = arena.segment_names
    assert len(names) == 3 and all(_exists(n) for n in names)
    arena.close()
    assert not any(_exists(n) for n in names)
    assert arena.segment_names == [] and arena.reserved_bytes == 0
    arena.close()
    with pytest.raises(ShoalError) as info:
        arena.allocate(1)
    assert info.value.code == ErrorCode.UNAVAILABLE


def test_constructor_validates(shm_prefix: str) -> None:
    with pytest.raises(ValueError):
        Arena("no-slash-", SEGMENT, SEGMENT)
    with pytest.raises(ValueError):
        Arena(shm_prefix, SEGMENT, SEGMENT - 1)


def test_exhausted_dev_shm_is_unavailable_not_a_crash(
    arena: Arena, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(name: str, size: int) -> Segment:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Segment, "create", staticmethod(no_space))
    with pytest.raises(ShoalError) as info:
        arena.allocate(1)
    assert info.value.code == ErrorCode.UNAVAILABLE
    assert "/shoal" not in info.value.message
    assert arena.segment_names == [] and arena.reserved_bytes == 0


def test_a_full_dev_shm_takes_back_the_kept_segments_first(
    shm_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    arena = Arena(shm_prefix + "full-", SEGMENT, 64 * SEGMENT)
    kept = arena.allocate(4 * SEGMENT)
    arena.free(kept)
    assert arena.kept_bytes == 4 * SEGMENT
    create = Segment.create
    calls: list[str] = []

    def full_while_kept(name: str, size: int) -> Segment:
        calls.append(name)
        if _exists(kept.region):
            raise OSError(28, "No space left on device")
        return create(name, size)

    monkeypatch.setattr(Segment, "create", staticmethod(full_while_kept))
    slot = arena.allocate(2 * SEGMENT)  # fails once, gives the kept segment back, succeeds
    assert len(calls) == 2 and not _exists(kept.region) and arena.kept_bytes == 0
    arena.free(slot)
    arena.close()
