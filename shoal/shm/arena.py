"""A process's own shared memory: lazily created segments carved into slots (docs/architecture.md
§4).

Each frontend and each worker owns one Arena. Segments are named ``f"{prefix}{n}"`` with n
counting up from 0; a name is never given to a second segment while the arena lives. The arena
never grows past ``max_bytes``. A request that does not fit *now* (other slots hold the room)
is a ShoalError(UNAVAILABLE), which the frontend answers with 503 (retry later); one that could
never fit, larger than ``max_bytes`` itself, is a ShoalError(INVALID_ARG) naming the limit
(400, gRPC INVALID_ARGUMENT: retrying cannot help).

Dedicated segments (one per request larger than a regular segment) are *kept* when their slot is
freed, still linked and mapped, and reused by a later large request of about the same size
(``KEEP_SLACK``): creating, faulting in and dropping a fresh 64 MB segment costs ~70 ms of CPU
against ~13 ms to fill one already mapped. Like a regular segment's slot, a freed slot of a kept
segment may then hold another tensor under the same name: a descriptor is only valid while its
slot (lease) is held. Kept segments are bounded (``keep_bytes`` in all, at most
``KEEP_PER_SIZE`` of one size; the oldest go first), count in ``reserved_bytes`` and are dropped
before anything else when the arena needs room, and are unlinked by ``close``. A process that
dies keeps nothing: its segments carry its prefix and are removed by the sweeps (shm/sweep.py).

Threads: not locked. Callers use an Arena from one thread (the event loop or the worker loop).
"""

from __future__ import annotations

import logging
import mmap
from dataclasses import dataclass

from shoal.errors import ErrorCode, ShoalError
from shoal.shm.allocator import SlotAllocator
from shoal.shm.segment import Segment, validate_segment_name

logger = logging.getLogger(__name__)

SLOT_ALIGNMENT = 64          # bytes; every slot offset is a multiple (cache line, SIMD loads)
_CREATE_ATTEMPTS = 8         # names skipped when a stale object holds one
KEEP_BYTES_DEFAULT = 256 * 1024 * 1024  # freed dedicated segments kept (capped at max_bytes/4)
KEEP_PER_SIZE = 2            # kept segments of one size at most
KEEP_SLACK = 4               # a kept segment serves requests of at least size - size/KEEP_SLACK


@dataclass(frozen=True, eq=False, slots=True)
class Slot:
    """``nbytes`` bytes at ``offset`` of segment ``region``; ``view`` is a writable memoryview of
    exactly those bytes, valid until the slot is freed. Identity equality (views are not
    compared)."""

    region: str
    offset: int
    nbytes: int
    view: memoryview


@dataclass(eq=False, slots=True)
class _ArenaSegment:
    segment: Segment
    allocator: SlotAllocator
    dedicated: bool          # sized for one oversized slot; kept or unlinked when it is freed


class Arena:
    """Owns segments named f"{prefix}{n}" (n = 0, 1, ...), each ``segment_bytes`` long, created
    lazily, at most ``max_bytes`` in total. Single-threaded: callers use it from one thread.
    ``keep_bytes``: freed dedicated segments kept for reuse, in bytes (default
    ``min(KEEP_BYTES_DEFAULT, max_bytes // 4)``; 0 unlinks each one when its slot is freed)."""

    def __init__(self, prefix: str, segment_bytes: int, max_bytes: int,
                 keep_bytes: int | None = None) -> None:
        validate_segment_name(f"{prefix}{2**32}")
        if segment_bytes < SLOT_ALIGNMENT:
            raise ValueError(f"segment_bytes must be at least {SLOT_ALIGNMENT}")
        if max_bytes < segment_bytes:
            raise ValueError("max_bytes must be at least segment_bytes")
        self._prefix = prefix
        self._segment_bytes = segment_bytes
        self._max_bytes = max_bytes
        # the largest rounded request one regular segment can take
        self._regular_capacity = segment_bytes - segment_bytes % SLOT_ALIGNMENT
        self._regular: list[_ArenaSegment] = []     # creation order: first fit scans these
        self._by_name: dict[str, _ArenaSegment] = {}
        self._next_index = 0
        self._reserved = 0
        self._closed = False
        self._keep_bytes = (min(KEEP_BYTES_DEFAULT, max_bytes // 4) if keep_bytes is None
                            else max(keep_bytes, 0))
        self._kept: list[_ArenaSegment] = []        # freed dedicated segments, oldest first
        self._kept_total = 0

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @property
    def used_bytes(self) -> int:
        """Bytes held by live slots (rounded up to the slot alignment)."""
        return sum(entry.allocator.used_bytes for entry in self._by_name.values())

    @property
    def reserved_bytes(self) -> int:
        """Bytes of shared memory this arena has created (sum of live segment sizes)."""
        return self._reserved

    @property
    def kept_bytes(self) -> int:
        """Bytes of freed dedicated segments kept for reuse (part of ``reserved_bytes``)."""
        return self._kept_total

    @property
    def segment_names(self) -> list[str]:
        """Every segment this arena holds, kept ones included."""
        return list(self._by_name)

    def allocate(self, nbytes: int) -> Slot:
        """A slot of ``nbytes`` bytes. First fit over existing segments, else a new segment;
        requests larger than a segment get a dedicated one. Raises ShoalError(UNAVAILABLE) when
        that would exceed ``max_bytes`` now, ShoalError(INVALID_ARG) when it always would."""
        if nbytes < 0:
            raise ValueError("nbytes must not be negative")
        if self._closed:
            raise ShoalError(ErrorCode.UNAVAILABLE, "shared-memory arena is closed")
        rounded = ((nbytes + SLOT_ALIGNMENT - 1) // SLOT_ALIGNMENT * SLOT_ALIGNMENT
                   or SLOT_ALIGNMENT)
        if rounded <= self._regular_capacity:
            for entry in self._regular:
                offset = entry.allocator.allocate(nbytes)
                if offset is not None:
                    return Slot(entry.segment.name, offset, nbytes,
                                entry.segment.buf[offset:offset + nbytes])
            entry = self._grow(self._segment_bytes, nbytes, dedicated=False)
        else:
            size = _round_up(rounded, mmap.PAGESIZE)
            if size > self._max_bytes:
                raise never_fits(nbytes, self._max_bytes)
            entry = self._take_kept(size) or self._grow(size, nbytes, dedicated=True)
        offset = entry.allocator.allocate(nbytes)
        if offset is None:  # cannot happen: a fresh segment fits the request
            raise ShoalError(ErrorCode.INTERNAL, "shared-memory arena bookkeeping error")
        return Slot(entry.segment.name, offset, nbytes, entry.segment.buf[offset:offset + nbytes])

    def free(self, slot: Slot) -> None:
        """Give a slot back. Its view is released when nothing else holds it."""
        # (try/except, not contextlib.suppress: this is the per-request path)
        try:  # noqa: SIM105
            slot.view.release()
        except BufferError:
            pass  # an array made from the view is still alive; the memory is reused regardless
        self.free_at(slot.region, slot.offset)

    def free_at(self, region: str, offset: int) -> None:
        """Give back the slot starting at ``offset`` of ``region`` (as carried in a TensorRef).
        KeyError if this arena has no such live slot."""
        entry = self._by_name.get(region)
        if entry is None:
            raise KeyError("no such segment in this arena")
        entry.allocator.free(offset)
        if entry.dedicated:
            self._keep_or_drop(entry)

    def close(self) -> None:
        """Unlink every segment, kept ones included; later allocations raise UNAVAILABLE.
        Idempotent."""
        self._closed = True
        self._kept.clear()
        self._kept_total = 0
        for entry in list(self._by_name.values()):
            self._drop(entry)
        self._regular.clear()

    def _take_kept(self, size: int) -> _ArenaSegment | None:
        """The smallest kept segment that holds ``size`` bytes and is not more than a
        1/KEEP_SLACK larger, taken out of the kept list; None if there is none."""
        best: _ArenaSegment | None = None
        for entry in self._kept:
            have = entry.segment.size
            if size <= have and have - have // KEEP_SLACK <= size \
                    and (best is None or have < best.segment.size):
                best = entry
        if best is not None:
            self._kept.remove(best)
            self._kept_total -= best.segment.size
        return best

    def _keep_or_drop(self, entry: _ArenaSegment) -> None:
        """A dedicated segment whose slot was freed: kept (newest last) within the bounds, the
        oldest kept ones dropped to make room; dropped at once if it alone exceeds them."""
        size = entry.segment.size
        if self._closed or size > self._keep_bytes:
            self._drop(entry)
            return
        same = [kept for kept in self._kept if kept.segment.size == size]
        if len(same) >= KEEP_PER_SIZE:
            self._drop_kept(same[0])
        while self._kept and self._kept_total + size > self._keep_bytes:
            self._drop_kept(self._kept[0])
        self._kept.append(entry)
        self._kept_total += size

    def _drop_kept(self, entry: _ArenaSegment) -> None:
        self._kept.remove(entry)
        self._kept_total -= entry.segment.size
        self._drop(entry)

    def _grow(self, size: int, nbytes: int, *, dedicated: bool) -> _ArenaSegment:
        while self._kept and self._reserved + size > self._max_bytes:
            self._drop_kept(self._kept[0])  # idle memory first, oldest first
        if self._reserved + size > self._max_bytes:
            self._drop_empty_segments(self._reserved + size - self._max_bytes)
        if self._reserved + size > self._max_bytes:
            raise ShoalError(
                ErrorCode.UNAVAILABLE,
                f"shared-memory arena is full: a tensor of {nbytes} bytes does not fit, "
                f"{self.used_bytes} of {self._max_bytes} bytes are in use",
            )
        segment = self._create_segment(size)
        entry = _ArenaSegment(segment, SlotAllocator(size, SLOT_ALIGNMENT), dedicated)
        self._by_name[segment.name] = entry
        if not dedicated:
            self._regular.append(entry)
        self._reserved += size
        return entry

    def _create_segment(self, size: int) -> Segment:
        for _ in range(_CREATE_ATTEMPTS):
            name = f"{self._prefix}{self._next_index}"
            self._next_index += 1
            try:
                return Segment.create(name, size)
            except FileExistsError:
                # a stale object of a dead process with a recycled pid; leave it to the sweep
                logger.warning("shared-memory segment %s already exists; skipping its name", name)
            except OSError as exc:
                if self._kept:  # /dev/shm itself is full: give back what this arena keeps
                    logger.warning("cannot create shared-memory segment %s of %d bytes (%s); "
                                   "dropping %d kept bytes and trying again", name, size, exc,
                                   self._kept_total)
                    while self._kept:
                        self._drop_kept(self._kept[0])
                    continue
                logger.error("cannot create shared-memory segment %s of %d bytes: %s",
                             name, size, exc)
                raise ShoalError(
                    ErrorCode.UNAVAILABLE,
                    f"shared memory is exhausted: cannot reserve {size} more bytes",
                ) from exc
        raise ShoalError(ErrorCode.INTERNAL, "cannot create a shared-memory segment")

    def _drop_empty_segments(self, wanted_bytes: int) -> None:
        """Unlink empty regular segments, newest first, until ``wanted_bytes`` are given back
        (so memory idle after a burst can serve a differently sized request); none if that
        cannot free enough."""
        empty = [entry for entry in self._regular if entry.allocator.allocation_count == 0]
        if sum(entry.segment.size for entry in empty) < wanted_bytes:
            return  # would not help: keep them for the next request
        for entry in reversed(empty):
            if wanted_bytes <= 0:
                return
            wanted_bytes -= entry.segment.size
            self._drop(entry)

    def _drop(self, entry: _ArenaSegment) -> None:
        """Unlink and unmap one segment (a kept one must have left ``_kept`` first, or the
        arena be closing)."""
        name = entry.segment.name
        del self._by_name[name]
        if not entry.dedicated:
            self._regular.remove(entry)
        self._reserved -= entry.segment.size
        entry.segment.close()

    def __repr__(self) -> str:
        return (f"Arena({self._prefix!r}, segments={len(self._by_name)}, "
                f"used={self.used_bytes}, kept={self._kept_total}, "
                f"reserved={self._reserved}/{self._max_bytes})")


def never_fits(nbytes: int, max_bytes: int) -> ShoalError:
    """The error for ``nbytes`` that no arena of ``max_bytes`` can ever hold. The text names
    the flag (the frontend's and each worker's arena have the same limit), not a segment."""
    return ShoalError(
        ErrorCode.INVALID_ARG,
        f"a tensor of {nbytes} bytes can never fit in shared memory: the server's limit per "
        f"process is {max_bytes} bytes (--shm-arena-byte-size)",
    )


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
