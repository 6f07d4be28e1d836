"""Client-registered POSIX shm objects as a worker sees them (system shared-memory extension).

The frontend checked each reference against the registration; the client still owns the object
and may shrink it at any time. So every access re-reads the object's real size (fstat) and
checks ``offset + nbytes`` against it with integer arithmetic before touching a byte: a client that
truncates its object gets an INVALID_ARG for its request, not a SIGBUS in the worker. (A client
that truncates in the microseconds between that check and the copy can still fault the worker; the
broker then fails that worker's requests and restarts it, as for any worker death.)

Which object: a key names different objects over time (a client unregisters a region, unlinks
its object, creates a new one under the same key and registers it again, e.g. each run of
tritonclient's simple shm examples). A reference carries the identity of the object the
frontend registered (``object_id``: its inode number, from the frontend's descriptor). One
mapping is cached per key (a name denotes at most one object at a time) and it is used only
while the same fstat that reads the size says its object still has its name and is that very
object (a reference without an identity, 0: any object the key names); otherwise the key is
opened again, the old mapping closed, and the new descriptor must be the registered object,
else the request gets INVALID_ARG (the registered object was removed: it cannot be reached by
name any more). So an object its client removed is refused at once, and a mapping of a
replaced object is never read or written.

Mappings of objects their client has unlinked pin that memory; ``drop_unlinked``, which the
worker calls between batches about once a second, closes them, so an unregistered and removed
object is unmapped here about a second later at most (no message needed from the frontend or
broker: the link count is the truth). Messages name the tensor, never the object's
key. Thread-safe: every call holds the instance's lock (the worker maps inputs from its main
thread while a decoupled model's outputs are written from others).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict

from shoal.errors import invalid_arg
from shoal.shm.segment import Segment, close_unlinked

logger = logging.getLogger(__name__)


class ClientRegions:
    def __init__(self, max_regions: int = 64) -> None:
        self._segments: OrderedDict[str, Segment] = OrderedDict()
        self._max = max_regions
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._segments)

    def view(self, key: str, offset: int, nbytes: int, tensor: str,
             writable: bool = False, object_id: int = 0) -> memoryview:
        """``nbytes`` at ``offset`` of the object ``key`` names, which must be object
        ``object_id`` (its inode number; 0: whichever object it names)."""
        if offset < 0 or nbytes < 0:
            raise invalid_arg(f"shared memory offset and size of '{tensor}' must not be negative")
        with self._lock:
            segment, size = self._segment(key, object_id, tensor, writable)
            if offset + nbytes > size:
                raise invalid_arg(f"shared memory region of '{tensor}' is smaller than the "
                                  f"{offset + nbytes} bytes the request needs ({size} bytes now)")
            if offset + nbytes > segment.size:  # grew since we mapped it: map again
                segment, _ = self._reattach(key, object_id, tensor, writable)
            return segment.buf[offset:offset + nbytes]

    def drop_unlinked(self) -> None:
        """Close the mappings of objects that no longer have a name (their client removed
        them): nothing can reach them by their key again, and they would pin memory."""
        with self._lock:
            close_unlinked(self._segments)

    def _segment(self, key: str, object_id: int, tensor: str, writable: bool
                 ) -> tuple[Segment, int]:
        """The cached mapping of ``key`` when it still maps object ``object_id`` under that
        name (and may be written if need be), else a new one; with the object's size now."""
        segment = self._segments.get(key)
        if segment is not None and (not writable or not segment.readonly):
            stat = _checked_stat(segment, tensor)
            if _is_object(stat, object_id):
                self._segments.move_to_end(key)
                return segment, stat.st_size
        return self._reattach(key, object_id, tensor, writable)

    def _reattach(self, key: str, object_id: int, tensor: str, writable: bool
                  ) -> tuple[Segment, int]:
        old = self._segments.pop(key, None)
        if old is not None:
            old.close()
        try:
            segment = Segment.attach(key, readonly=not writable)
        except (OSError, ValueError) as exc:
            logger.warning("cannot map client region for '%s': %s", tensor, exc)
            raise invalid_arg(f"shared memory region of '{tensor}' cannot be mapped: it no "
                              "longer exists or is empty") from exc
        stat = _checked_stat(segment, tensor)
        if object_id and stat.st_ino != object_id:
            segment.close()
            raise invalid_arg(f"shared memory region of '{tensor}' is no longer the object "
                              "that was registered (its key now names another one); register "
                              "the region again")
        self._segments[key] = segment
        while len(self._segments) > self._max:
            _, evicted = self._segments.popitem(last=False)
            evicted.close()
        return segment, stat.st_size

    def close(self) -> None:
        with self._lock:
            for segment in self._segments.values():
                segment.close()
            self._segments.clear()


def _is_object(stat: os.stat_result, object_id: int) -> bool:
    """Whether a mapping whose descriptor fstats as ``stat`` serves references to
    ``object_id``: its object still has its name (one the client removed is refused, and may
    have been replaced under the same key) and is that very inode (any, no identity given)."""
    return stat.st_nlink > 0 and (not object_id or stat.st_ino == object_id)


def _checked_stat(segment: Segment, tensor: str) -> os.stat_result:
    try:
        return segment.stat()
    except (OSError, ValueError) as exc:
        raise invalid_arg(f"shared memory region of '{tensor}' is no longer available"
                          ) from exc
