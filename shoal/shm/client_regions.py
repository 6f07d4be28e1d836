"""Client-registered POSIX shm objects as a worker sees them (system shared-memory extension).

The frontend checked each reference against the registration; the client still owns the object
and may shrink it at any time. So every access re-reads the object's real size (fstat) and
checks ``offset + nbytes`` against it with integer arithmetic before touching a byte: a client that
truncates its object gets an INVALID_ARG for its request, not a SIGBUS in the worker. (A client
that truncates in the microseconds between that check and the copy can still fault the worker; the
broker then fails that worker's requests and restarts it, as for any worker death.)

Which object: a key is only a name, and names different objects over time (a client
unregisters a region, unlinks its object, creates a new one under the same key and registers it
again; or someone puts a hard link to one of the server's own segments under the key). A
reference carries the identity of the object the frontend registered (``object_id`` /
``object_dev``: its inode and device, from the frontend's descriptor); one without it is
refused. Mappings are cached by that identity, never by key, so a re-registration over a new
object can never be served from the mapping of the old one. A new mapping opens the key, and
the fstat of the descriptor it got must pass ``object_identity.refusal`` against the
registered identity (the same object, one link, not one of the server's segments, owned by this
uid unless foreign owners are allowed) before a byte is read or written; a cached mapping is
re-checked with the same fstat that reads its size, at every use. A refusal is INVALID_ARG for
the request, naming the tensor (never the object's key), and closes the mapping.

Mappings of objects their client has unlinked pin that memory; ``drop_unlinked``, which the
worker calls between batches about once a second, closes them (no message needed from the
frontend or broker: the link count is the truth). Thread-safe: every call holds the instance's
lock (the worker maps inputs from its main thread while a decoupled model's outputs are written
from others).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict

from shoal.errors import invalid_arg
from shoal.shm.object_identity import (
    SHM_DIRECTORY,
    ObjectIdentity,
    refusal,
    server_segment_identities,
)
from shoal.shm.segment import Segment

logger = logging.getLogger(__name__)


class ClientRegions:
    """``allow_foreign_owner``: --client-shm-allow-foreign-owner; ``shm_directory``: where the
    server's own segments are listed (their identities are refused); ``euid``: the owner
    allowed (default: this process's effective uid; a parameter for tests)."""

    def __init__(self, max_regions: int = 64, *, allow_foreign_owner: bool = False,
                 shm_directory: str = SHM_DIRECTORY, euid: int | None = None) -> None:
        self._segments: OrderedDict[ObjectIdentity, Segment] = OrderedDict()
        self._max = max_regions
        self._allow_foreign_owner = allow_foreign_owner
        self._directory = shm_directory
        self._euid = euid
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._segments)

    def view(self, key: str, offset: int, nbytes: int, tensor: str,
             writable: bool = False, object_id: int = 0, object_dev: int = 0) -> memoryview:
        """``nbytes`` at ``offset`` of the object ``key`` names, which must be the registered
        object (``object_dev``, ``object_id``: its device and inode number)."""
        if offset < 0 or nbytes < 0:
            raise invalid_arg(f"shared memory offset and size of '{tensor}' must not be negative")
        if not object_id:
            raise invalid_arg(f"shared memory region of '{tensor}' carries no identity of a "
                              "registered object; refused")
        identity = ObjectIdentity(object_dev, object_id)
        with self._lock:
            segment, size = self._segment(key, identity, tensor, writable)
            if offset + nbytes > size:
                raise invalid_arg(f"shared memory region of '{tensor}' is smaller than the "
                                  f"{offset + nbytes} bytes the request needs ({size} bytes now)")
            if offset + nbytes > segment.size:  # grew since we mapped it: map again
                segment, _ = self._attach(key, identity, tensor, writable)
            return segment.buf[offset:offset + nbytes]

    def drop_unlinked(self) -> None:
        """Close the mappings of objects that no longer have a name (their client removed
        them): nothing can reach them by their key again, and they would pin memory."""
        with self._lock:
            for identity, segment in list(self._segments.items()):
                try:
                    linked = segment.linked()
                except (OSError, ValueError):
                    linked = False
                if not linked:
                    self._forget(identity)

    def _segment(self, key: str, identity: ObjectIdentity, tensor: str, writable: bool
                 ) -> tuple[Segment, int]:
        """The cached mapping of the registered object, after checking its fstat now (and
        that it may be written if need be), else a new one; with the object's size now."""
        segment = self._segments.get(identity)
        if segment is None or (writable and segment.readonly):
            return self._attach(key, identity, tensor, writable)
        info = self._checked_stat(segment, identity, tensor)
        self._refuse_unless_allowed(info, identity, tensor, set())
        self._segments.move_to_end(identity)
        return segment, info.st_size

    def _attach(self, key: str, identity: ObjectIdentity, tensor: str, writable: bool
                ) -> tuple[Segment, int]:
        """Open ``key`` by name and keep the mapping only if its descriptor fstats as the
        registered object (nothing is read or written before that check)."""
        self._forget(identity)
        try:
            segment = Segment.attach(key, readonly=not writable)
        except (OSError, ValueError) as exc:
            logger.warning("cannot map client region for '%s': %s", tensor, exc)
            raise invalid_arg(f"shared memory region of '{tensor}' cannot be mapped: it no "
                              "longer exists or is empty") from exc
        try:
            info = segment.stat()
            self._refuse_unless_allowed(info, identity, tensor,
                                        server_segment_identities(self._directory))
        except BaseException:
            segment.close()
            raise
        self._segments[identity] = segment
        while len(self._segments) > self._max:
            _, evicted = self._segments.popitem(last=False)
            evicted.close()
        return segment, info.st_size

    def _refuse_unless_allowed(self, info: os.stat_result, identity: ObjectIdentity,
                               tensor: str, own: set[ObjectIdentity]) -> None:
        reason = refusal(info, identity, allow_foreign_owner=self._allow_foreign_owner,
                         own=own, euid=self._euid)
        if reason is not None:
            self._forget(identity)
            logger.warning("refused client region for '%s': it %s", tensor, reason)
            raise invalid_arg(f"shared memory region of '{tensor}' {reason}")

    def _checked_stat(self, segment: Segment, identity: ObjectIdentity,
                      tensor: str) -> os.stat_result:
        try:
            return segment.stat()
        except (OSError, ValueError) as exc:
            self._forget(identity)
            raise invalid_arg(f"shared memory region of '{tensor}' is no longer available"
                              ) from exc

    def _forget(self, identity: ObjectIdentity) -> None:
        old = self._segments.pop(identity, None)
        if old is not None:
            old.close()

    def close(self) -> None:
        with self._lock:
            for segment in self._segments.values():
                segment.close()
            self._segments.clear()
