"""One POSIX shared-memory object mapped into this process (docs/architecture.md §4).

Ownership: the process that creates a segment owns it and is the only one that unlinks it; other
processes attach and close. ``posix_ipc`` + ``mmap`` are used instead of
``multiprocessing.shared_memory`` so that no resource_tracker process unlinks segments behind the
owner's back.

Threads: a Segment is not locked; each process uses its segments from one thread, or guards them.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
from collections.abc import MutableMapping
from types import TracebackType

import posix_ipc

logger = logging.getLogger(__name__)

# Linux: a shm name is a file in /dev/shm, so the part after the '/' is at most NAME_MAX bytes.
MAX_SEGMENT_NAME_BYTES = 255


def validate_segment_name(name: str) -> None:
    """A segment name is ``/`` followed by 1..255 bytes with no other ``/`` and no NUL.

    Raises ValueError otherwise."""
    if not name.startswith("/"):
        raise ValueError("shared-memory name must start with '/'")
    body = name[1:]
    if not body or body in (".", ".."):
        raise ValueError("shared-memory name is empty")
    if "/" in body or "\x00" in body:
        raise ValueError("shared-memory name must not contain '/' or NUL after the leading '/'")
    if len(body.encode("utf-8")) > MAX_SEGMENT_NAME_BYTES:
        raise ValueError(
            f"shared-memory name is longer than {MAX_SEGMENT_NAME_BYTES} bytes after the '/'"
        )


def unlink_segment(name: str) -> bool:
    """Remove the shm object ``name``; True if it existed. Mappings elsewhere stay valid."""
    validate_segment_name(name)
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        return False
    return True


class Segment:
    """One POSIX shm object mapped into this process. The creator is the owner: only it unlinks.

    The file descriptor stays open while the segment is open, so ``stat`` can ``fstat`` the
    very object that is mapped (not whatever now carries the name)."""

    def __init__(
        self,
        name: str,
        shm: posix_ipc.SharedMemory,
        mapping: mmap.mmap,
        size: int,
        is_owner: bool,
        readonly: bool,
    ) -> None:
        # Use Segment.create / Segment.attach.
        self.name = name
        self.size = size
        self.is_owner = is_owner
        self.readonly = readonly
        self._shm: posix_ipc.SharedMemory | None = shm
        self._mmap: mmap.mmap | None = mapping
        self._buf: memoryview | None = memoryview(mapping)
        self._unlinked = False

    @classmethod
    def create(cls, name: str, size: int) -> Segment:
        """Create (O_CREAT|O_EXCL, mode 0600), size and map a new segment owned by this process.

        The pages are reserved with ``posix_fallocate`` so that a full /dev/shm fails here with
        OSError(ENOSPC) instead of killing a later writer with SIGBUS. Raises
        FileExistsError if the name is taken."""
        validate_segment_name(name)
        if size <= 0:
            raise ValueError("segment size must be positive")
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
        except posix_ipc.ExistentialError as exc:
            raise FileExistsError(errno.EEXIST, "shared-memory segment already exists") from exc
        try:
            os.posix_fallocate(shm.fd, 0, size)
            mapping = mmap.mmap(shm.fd, size, flags=mmap.MAP_SHARED,
                                prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            shm.close_fd()
            _unlink_quietly(name)
            raise
        return cls(name, shm, mapping, size, is_owner=True, readonly=False)

    @classmethod
    def attach(cls, name: str, readonly: bool = False) -> Segment:
        """Map an existing segment (size from fstat). Raises FileNotFoundError if it does not
        exist, ValueError if it is empty."""
        validate_segment_name(name)
        try:
            shm = posix_ipc.SharedMemory(name, 0, read_only=readonly)
        except posix_ipc.ExistentialError as exc:
            raise FileNotFoundError(errno.ENOENT, "shared-memory segment does not exist") from exc
        try:
            size = os.fstat(shm.fd).st_size
            if size <= 0:
                raise ValueError("shared-memory segment is empty")
            prot = mmap.PROT_READ if readonly else mmap.PROT_READ | mmap.PROT_WRITE
            mapping = mmap.mmap(shm.fd, size, flags=mmap.MAP_SHARED, prot=prot)
        except BaseException:
            shm.close_fd()
            raise
        return cls(name, shm, mapping, size, is_owner=False, readonly=readonly)

    @property
    def buf(self) -> memoryview:
        """The whole mapping (format 'B'); read-only if attached read-only."""
        if self._buf is None:
            raise ValueError("segment is closed")
        return self._buf

    @property
    def closed(self) -> bool:
        return self._buf is None

    def stat(self) -> os.stat_result:
        """``fstat`` of the mapped object's descriptor: its size (smaller than ``size``: it was
        truncated and touching the tail would SIGBUS), link count and inode number now (the
        very object mapped, whatever the name denotes meanwhile)."""
        if self._shm is None:
            raise ValueError("segment is closed")
        return os.fstat(self._shm.fd)

    def linked(self) -> bool:
        """Whether the mapped object still has its name (an ``fstat`` of the descriptor: its
        link count drops to 0 once the owner unlinked it). A mapping of an unlinked object
        still pins its memory until it is unmapped."""
        return self.stat().st_nlink > 0

    def close(self) -> None:
        """Unmap and close; the owner also unlinks. Idempotent. If views or arrays exported from
        ``buf`` are still alive the unmap is left to the garbage collector (never raises)."""
        buf, mapping, shm = self._buf, self._mmap, self._shm
        self._buf = self._mmap = self._shm = None
        if buf is not None:
            # an ndarray may still hold it; the mmap then stays alive with it
            with contextlib.suppress(BufferError):
                buf.release()
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:
                logger.debug("segment %s still has exported views; unmap deferred", self.name)
        if shm is not None:
            shm.close_fd()
        if self.is_owner:
            self.unlink()

    def unlink(self) -> None:
        """Remove the name (idempotent); only the owner should call this."""
        if not self._unlinked:
            self._unlinked = True
            _unlink_quietly(self.name)

    def __enter__(self) -> Segment:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("owner" if self.is_owner else "attached")
        return f"Segment({self.name!r}, size={self.size}, {state})"


def close_unlinked(segments: MutableMapping[str, Segment]) -> None:
    """Close and drop the cached mappings in ``segments`` whose object lost its name (or can
    no longer be fstat'ed): nothing reaches it by name again, and the mapping pins its memory.
    The caller serializes access to ``segments``."""
    for name in [name for name, segment in segments.items() if not _still_linked(segment)]:
        segment = segments.pop(name, None)
        if segment is not None:
            segment.close()


def _still_linked(segment: Segment) -> bool:
    try:
        return segment.linked()
    except (OSError, ValueError):
        return False


def _unlink_quietly(name: str) -> None:
    with contextlib.suppress(posix_ipc.ExistentialError):
        posix_ipc.unlink_shared_memory(name)
