"""``shm.object_identity.refusal``: the one policy the frontend and the worker apply to the fstat
of a client object (fake stat results, so owners other than this uid need no root)."""

from __future__ import annotations

import os
import stat

import pytest

from shoal.shm.object_identity import ObjectIdentity, refusal, server_segment_identities

REGISTERED = ObjectIdentity(27, 1001)


def fake_stat(*, ino: int = 1001, dev: int = 27, nlink: int = 1, uid: int = 1000,
              mode: int = stat.S_IFREG | 0o600) -> os.stat_result:
    # (mode, ino, dev, nlink, uid, gid, size, atime, mtime, ctime)
    return os.stat_result((mode, ino, dev, nlink, uid, uid, 4096, 0, 0, 0))


def test_the_registered_object_of_this_uid_is_allowed() -> None:
    assert refusal(fake_stat(), REGISTERED, allow_foreign_owner=False, euid=1000) is None
    assert refusal(fake_stat(), None, allow_foreign_owner=False, euid=1000) is None


@pytest.mark.parametrize(("info", "words"), [
    (fake_stat(ino=1002), "no longer the object that was registered"),
    (fake_stat(dev=28), "no longer the object that was registered"),
    (fake_stat(nlink=2), "more than one link"),
    (fake_stat(nlink=0), "removed"),
    (fake_stat(mode=stat.S_IFIFO | 0o600), "does not name a shared memory object"),
    (fake_stat(uid=0), "owned by another user (uid 0)"),
])
def test_everything_else_is_refused(info: os.stat_result, words: str) -> None:
    reason = refusal(info, REGISTERED, allow_foreign_owner=False, euid=1000)
    assert reason is not None and words in reason


def test_foreign_owners_only_with_the_flag() -> None:
    foreign = fake_stat(uid=4321)
    reason = refusal(foreign, REGISTERED, allow_foreign_owner=False, euid=1000)
    assert reason is not None and "--client-shm-allow-foreign-owner=true" in reason
    assert refusal(foreign, REGISTERED, allow_foreign_owner=True, euid=1000) is None
    # the flag allows owners, nothing else
    assert refusal(fake_stat(uid=4321, nlink=2), REGISTERED, allow_foreign_owner=True,
                   euid=1000) is not None


def test_a_server_segment_is_refused_even_with_one_link() -> None:
    """E.g. a segment renamed (not linked) under a client key."""
    reason = refusal(fake_stat(), None, allow_foreign_owner=True, own={REGISTERED}, euid=1000)
    assert reason is not None and "reserved for the server" in reason


def test_server_segments_are_listed_by_prefix(tmp_path: os.PathLike[str]) -> None:
    directory = os.fspath(tmp_path)
    for name in ("shoal-abc-fe1-0", "shoal-abc.lock", "client"):
        with open(os.path.join(directory, name), "wb"):
            pass
    os.symlink("client", os.path.join(directory, "shoal-link"))
    found = server_segment_identities(directory)
    expected = {ObjectIdentity.of(os.stat(os.path.join(directory, n), follow_symlinks=False))
                for n in ("shoal-abc-fe1-0", "shoal-abc.lock", "shoal-link")}
    assert found == expected
    assert ObjectIdentity.of(os.stat(os.path.join(directory, "client"))) not in found
    assert server_segment_identities(os.path.join(directory, "missing")) == set()
