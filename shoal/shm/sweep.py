"""Finding and removing the shared memory of dead servers (docs/architecture.md §4, §8).

Every server instance has a random id that appears in all its segment names
(``/shoal-<id>-...``) and a lock file ``<shm_dir>/shoal-<id>.lock``. Every process of the
instance (supervisor, broker, frontends, workers) holds a *shared* ``flock`` on that file for its
whole life: the supervisor creates it, every child joins it at start (``InstanceLock.join``). The
kernel drops a process's flock when it dies, even by SIGKILL. A sweep asks for an *exclusive*
lock, which the kernel grants only when no process of the instance lives: so at start a server
can tell the segments of dead instances (lock free or missing) from those of live ones (held by
any member, e.g. children still draining after their supervisor was killed) and remove only the
former.

Ordering contract: the supervisor creates the lock before any process of the instance exists,
and the file appears already locked (created under a temporary name, locked, then linked into
place), so a sweep can never see an unlocked lock file of a live server. A child joins before
it creates a segment, and only while another member holds the lock (a child whose instance is
already gone refuses to start).

The last member out (``leave`` wins the exclusive lock) removes what the instance left: its
segments, its runtime dir (the caller's ``on_last``) and the lock file. A member that dies by
SIGKILL removes nothing; the next sweep does, once no member lives.

Descriptors are close-on-exec: a spawned child joins by path, never by inheritance (a forked
child would share its parent's open file description, and with it the parent's lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Final

logger = logging.getLogger(__name__)

INSTANCE_ID_PATTERN = re.compile(r"[0-9a-f]{12}")
# shoal-<id>-<anything> (a segment) or shoal-<id>.lock (the instance lock)
_INSTANCE_FILE = re.compile(r"shoal-([0-9a-f]{12})(?:-.*|\.lock)", re.DOTALL)
_SEGMENT_PREFIX = re.compile(r"/shoal-[0-9a-f]{12}-[^/]*")


def new_instance_id() -> str:
    """12 lowercase hex characters (48 random bits)."""
    return secrets.token_hex(6)


def lock_path(instance_id: str, shm_dir: str = "/dev/shm") -> str:
    return os.path.join(shm_dir, f"shoal-{instance_id}.lock")


# A failed shared->exclusive conversion drops our shared lock (flock(2)); retrying then waits out
# a sweep's momentary probe, or members that are exiting. A member that lives on keeps its
# shared lock, and is the one that wins when it leaves.
LEAVE_WAIT_S: Final = 0.03
_LEAVE_RETRY_S: Final = 0.01


class InstanceGone(RuntimeError):
    """Joining failed: no live process holds the instance lock (the server is gone or being
    swept)."""


class InstanceLock:
    """This process's share of an instance's lock: a shared flock on
    f"{shm_dir}/shoal-{instance_id}.lock", held until ``leave`` (or death). The constructor
    creates the lock (the supervisor); ``join`` takes a share of an existing one (children)."""

    def __init__(self, instance_id: str, shm_dir: str = "/dev/shm") -> None:
        if not INSTANCE_ID_PATTERN.fullmatch(instance_id):
            raise ValueError("instance_id must be 12 lowercase hex characters")
        self.instance_id = instance_id
        self.path = lock_path(instance_id, shm_dir)
        self._fd: int | None = _create_locked(self.path, shm_dir)

    @classmethod
    def join(cls, instance_id: str, shm_dir: str = "/dev/shm") -> InstanceLock:
        """A share of the lock of a live instance. Raises InstanceGone when the lock file is
        missing, being swept, or was replaced (a sweep removed it after we opened it)."""
        if not INSTANCE_ID_PATTERN.fullmatch(instance_id):
            raise ValueError("instance_id must be 12 lowercase hex characters")
        path = lock_path(instance_id, shm_dir)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise InstanceGone(f"shoal instance {instance_id} is gone: {path} is missing") \
                from None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            if not _same_file(fd, path):
                raise InstanceGone(f"shoal instance {instance_id} is gone: {path} was removed")
        except BlockingIOError:
            os.close(fd)  # only a sweep holds it exclusively: no member lives
            raise InstanceGone(f"shoal instance {instance_id} is gone: {path} is being "
                               "swept") from None
        except BaseException:
            os.close(fd)
            raise
        lock = cls.__new__(cls)
        lock.instance_id, lock.path, lock._fd = instance_id, path, fd
        return lock

    @property
    def held(self) -> bool:
        return self._fd is not None

    def leave(self, on_last: Callable[[], None] | None = None,
              wait_s: float = LEAVE_WAIT_S) -> bool:
        """Give up this share. The last member out (the exclusive lock is granted within
        ``wait_s``: no other member lives) runs ``on_last`` under that lock, then removes the
        lock file, and gets True. Idempotent (False after the first call)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return False
        try:
            if not _won_exclusive(fd, wait_s) or not _same_file(fd, self.path):
                return False
            if on_last is not None:
                on_last()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            return True
        finally:
            os.close(fd)  # closing our only descriptor drops our flock

    def release(self) -> None:
        """``leave`` without clean-up of segments (the lock file goes if we are the last)."""
        self.leave()


def _won_exclusive(fd: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_LEAVE_RETRY_S)


def _same_file(fd: int, path: str) -> bool:
    """``fd`` is still the file at ``path`` (a sweep may have removed or replaced it)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _create_locked(path: str, shm_dir: str) -> int:
    """Create ``path`` already locked (shared): lock a private temporary file, then hard-link it
    into place (fails if ``path`` exists). Returns the locked descriptor."""
    temporary = os.path.join(shm_dir, f".{os.path.basename(path)}.{os.getpid()}."
                                      f"{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.link(temporary, path)
    except BaseException:
        os.close(fd)
        raise
    finally:
        os.unlink(temporary)
    return fd


def sweep_stale_segments(shm_dir: str = "/dev/shm") -> list[str]:
    """Remove every ``shoal-<id>-*`` and ``shoal-<id>.lock`` in ``shm_dir`` whose instance lock is
    not held by a live process (lock file missing, or free). Never touches a live server's
    files. Returns the removed file names."""
    try:
        names = os.listdir(shm_dir)
    except FileNotFoundError:
        return []
    by_instance: dict[str, list[str]] = defaultdict(list)
    for name in names:
        match = _INSTANCE_FILE.fullmatch(name)
        if match:
            by_instance[match.group(1)].append(name)
    removed: list[str] = []
    for instance_id, files in sorted(by_instance.items()):
        removed.extend(_sweep_instance(instance_id, files, shm_dir))
    if removed:
        logger.info("removed %d shared-memory files of dead shoal servers", len(removed))
    return removed


def instance_alive(instance_id: str, shm_dir: str = "/dev/shm") -> bool:
    """True while a live process of the instance holds its lock (any member: supervisor,
    broker, frontend or worker)."""
    try:
        fd = os.open(lock_path(instance_id, shm_dir), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _sweep_instance(instance_id: str, files: list[str], shm_dir: str) -> list[str]:
    """Remove ``files`` of one instance if its lock is free; holds that lock while removing."""
    path = lock_path(instance_id, shm_dir)
    try:
        fd: int | None = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = None
    except PermissionError:  # another user's server (e.g. beside a systemd service's user):
        return []            # its files are not ours to probe or remove
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return []  # a live process holds it
        lock_name = os.path.basename(path)
        segments = [name for name in files if name != lock_name]
        removed = _remove_files(shm_dir, segments)
        if fd is not None:
            removed.extend(_remove_files(shm_dir, [lock_name]))
        logger.debug("swept shoal instance %s: %s", instance_id, removed)
        return removed
    finally:
        if fd is not None:
            os.close(fd)


def remove_segments_with_prefix(prefix: str, shm_dir: str = "/dev/shm") -> list[str]:
    """Remove the segments whose names start with ``prefix`` (segment-name form, e.g.
    ``/shoal-<id>-w-mlp_0_0-5678-``), used when their owner died. The prefix must name one
    instance (``/shoal-<id>-...``); instance lock files never match. Returns removed file names."""
    if not _SEGMENT_PREFIX.fullmatch(prefix):
        raise ValueError("prefix must look like '/shoal-<instance_id>-...' with no other '/'")
    file_prefix = prefix[1:]
    try:
        names = os.listdir(shm_dir)
    except FileNotFoundError:
        return []
    return _remove_files(shm_dir, sorted(n for n in names if n.startswith(file_prefix)))


def _remove_files(directory: str, names: list[str]) -> list[str]:
    removed: list[str] = []
    for name in names:
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            continue  # someone else removed it first
        except OSError as exc:
            logger.warning("cannot remove %s: %s", name, exc)
            continue
        removed.append(name)
    return removed
