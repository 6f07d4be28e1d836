"""Which POSIX shm object a client registered, and whether this server may touch it (system
shared-memory extension; docs/architecture.md §4).

A key is only a name: between registration and use the client (or anyone who may write in
/dev/shm) can put another object under it, e.g. a hard link to one of the server's own
segments. So a registration records the object's identity (``ObjectIdentity``: st_dev and
st_ino from an fstat of the descriptor the frontend opened), every reference to the region
carries it, and whoever opens the key later fstats the descriptor it got and refuses anything
else. ``refusal`` is the one policy both the frontend (at registration and at every use) and
the worker (at every map and every use of a mapping) apply to such an fstat:

- the object must be the registered one (same st_dev and st_ino);
- a regular file with exactly one link: a second name could be a segment of this server or
  another user's object the client may not name (0 links: its client removed it);
- not one of this server's own segments (``server_segment_identities``: every ``shoal-``
  object in the directory, plus those the caller holds itself);
- owned by this process's effective uid unless the operator allowed foreign owners
  (--client-shm-allow-foreign-owner): a server running as root would otherwise read and write
  other users' 0600 objects for any network client.

Pure functions over ``os.stat_result``; the only I/O is ``server_segment_identities``' scan.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from typing import Final, NamedTuple

SHM_DIRECTORY: Final = "/dev/shm"  # where Linux (glibc shm_open) keeps POSIX shm objects
SERVER_OBJECT_PREFIX: Final = "shoal-"  # every segment and lock of every shoal server


class ObjectIdentity(NamedTuple):
    """A file's identity while it exists: (st_dev, st_ino). ``ino`` 0: unknown."""

    dev: int
    ino: int

    @staticmethod
    def of(info: os.stat_result) -> ObjectIdentity:
        return ObjectIdentity(info.st_dev, info.st_ino)


def refusal(info: os.stat_result, expected: ObjectIdentity | None, *,
            allow_foreign_owner: bool, own: Collection[ObjectIdentity] = (),
            euid: int | None = None) -> str | None:
    """Why the object that fstat'ed as ``info`` may not be served for a registration of
    ``expected`` (None: at registration, nothing to compare yet), or None when it may. ``own``:
    identities of this server's segments; ``euid``: the uid that may own it (default: this
    process's effective uid). The reason is a clause for a message that names the region."""
    if not stat.S_ISREG(info.st_mode):
        return "does not name a shared memory object"
    if expected is not None and ObjectIdentity.of(info) != expected:
        return ("is no longer the object that was registered (its key now names another "
                "one); register the region again")
    if info.st_nlink == 0:
        return "was removed by its owner; register the region again"
    if info.st_nlink > 1:
        return "names an object with more than one link; refused"
    if ObjectIdentity.of(info) in own:
        return "names shared memory reserved for the server itself"
    owner = os.geteuid() if euid is None else euid
    if not allow_foreign_owner and info.st_uid != owner:
        return ("names an object owned by another user (uid "
                f"{info.st_uid}); the server allows only its own "
                "(--client-shm-allow-foreign-owner=true allows others)")
    return None


def server_segment_identities(directory: str = SHM_DIRECTORY) -> set[ObjectIdentity]:
    """The identities of every shoal server object in ``directory`` now (names starting with
    ``shoal-``; not followed if they are links). Objects that vanish meanwhile are skipped."""
    found: set[ObjectIdentity] = set()
    try:
        entries = os.scandir(directory)
    except OSError:
        return found
    with entries:
        for entry in entries:
            if not entry.name.startswith(SERVER_OBJECT_PREFIX):
                continue
            try:
                found.add(ObjectIdentity.of(entry.stat(follow_symlinks=False)))
            except OSError:
                continue
    return found
