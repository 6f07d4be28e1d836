"""Segments owned by other processes of this server, attached on first use (docs/architecture.md
§4).

The frontend reads worker outputs and workers read frontend inputs through this cache. It only
ever attaches names under this server's own prefix, checks every (offset, nbytes) against the
mapped size, and never unlinks: the owner does that. A cached mapping of a segment its owner
has unlinked would pin that memory (a dropped dedicated segment of up to the arena's size), so
each new attach first closes the cached mappings whose object lost its name (one ``fstat``
each; attaches are rare: owners keep and reuse their segments).

Errors raise ShoalError(INTERNAL) with messages that never contain a segment name (they may reach
clients); the name is logged instead.

Threads: not locked; one owner thread (the event loop or the worker loop).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from shoal.errors import ErrorCode, ShoalError
from shoal.shm.segment import Segment, close_unlinked

logger = logging.getLogger(__name__)


class RegionCache:
    """Attach-on-first-use cache of segments owned by *other* processes of this server
    (frontend reads worker outputs, workers read frontend inputs). Bounded (LRU, max_regions);
    evicted/forgotten segments are closed, never unlinked."""

    def __init__(self, allowed_prefix: str, max_regions: int = 256) -> None:
        if not allowed_prefix.startswith("/") or len(allowed_prefix) < 2:
            raise ValueError("allowed_prefix must be a segment-name prefix such as '/shoal-<id>-'")
        if max_regions < 1:
            raise ValueError("max_regions must be at least 1")
        self._allowed_prefix = allowed_prefix
        self._max_regions = max_regions
        self._segments: OrderedDict[str, Segment] = OrderedDict()

    def __len__(self) -> int:
        return len(self._segments)

    def __contains__(self, region: object) -> bool:
        return region in self._segments

    def view(self, region: str, offset: int, nbytes: int, readonly: bool = True) -> memoryview:
        """``nbytes`` bytes at ``offset`` of ``region``. A view that does not fit the cached
        mapping triggers one re-attach (the owner may have recreated the segment bigger)."""
        if not region.startswith(self._allowed_prefix):
            logger.warning("refused a tensor reference to a foreign segment %r", region)
            raise ShoalError(ErrorCode.INTERNAL,
                             "tensor reference names a segment outside this server")
        if offset < 0 or nbytes < 0:
            raise ShoalError(ErrorCode.INTERNAL,
                             "tensor reference has a negative offset or byte size")
        segment = self._segments.get(region)
        if segment is not None and (readonly or not segment.readonly):
            self._segments.move_to_end(region)
            if _fits(segment.size, offset, nbytes):
                return _slice(segment, offset, nbytes, readonly)
        segment = self._attach(region, readonly)
        if not _fits(segment.size, offset, nbytes):
            logger.warning("tensor reference [%d, +%d) exceeds segment %s of %d bytes",
                           offset, nbytes, region, segment.size)
            raise ShoalError(ErrorCode.INTERNAL,
                             "tensor reference is out of bounds of its shared-memory segment")
        return _slice(segment, offset, nbytes, readonly)

    def mapped_size(self, region: str) -> int | None:
        """Size of the cached mapping of ``region``; None when it is not mapped."""
        segment = self._segments.get(region)
        return None if segment is None else segment.size

    def forget(self, region: str) -> None:
        """Close (never unlink) the mapping of ``region`` if cached."""
        segment = self._segments.pop(region, None)
        if segment is not None:
            segment.close()

    def forget_prefix(self, prefix: str) -> None:
        """Close every cached mapping whose name starts with ``prefix`` (e.g. a dead worker's)."""
        for region in [name for name in self._segments if name.startswith(prefix)]:
            self.forget(region)

    def forget_unlinked(self) -> None:
        """Close the cached mappings of segments that their owner has unlinked."""
        close_unlinked(self._segments)

    def close(self) -> None:
        for region in list(self._segments):
            self.forget(region)

    def _attach(self, region: str, readonly: bool) -> Segment:
        """(Re-)attach ``region``, replacing any cached mapping, and evict the LRU overflow
        and the mappings of unlinked segments."""
        self.forget(region)
        self.forget_unlinked()
        try:
            segment = Segment.attach(region, readonly=readonly)
        except (OSError, ValueError) as exc:
            logger.warning("cannot attach shared-memory segment %s: %s", region, exc)
            raise ShoalError(ErrorCode.INTERNAL,
                             "the shared-memory segment of a tensor is not available") from None
        self._segments[region] = segment
        while len(self._segments) > self._max_regions:
            _, evicted = self._segments.popitem(last=False)
            evicted.close()
        return segment


def _fits(size: int, offset: int, nbytes: int) -> bool:
    # written so that no intermediate sum can exceed size (safe for fixed-width ports too)
    return nbytes <= size and offset <= size - nbytes


def _slice(segment: Segment, offset: int, nbytes: int, readonly: bool) -> memoryview:
    view = segment.buf[offset:offset + nbytes]
    if readonly and not segment.readonly:
        return view.toreadonly()
    return view
