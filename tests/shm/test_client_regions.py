"""The worker's view of client system shm objects (``shoal.shm.client_regions``): a key that
names a new object (unregistered, unlinked, created again, registered again) is never served
from the mapping of the old one, and mappings of removed objects are closed."""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections.abc import Iterator

import posix_ipc
import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.shm.client_regions import ClientRegions
from shoal.shm.segment import Segment


@pytest.fixture
def key() -> Iterator[str]:
    name = f"/shmtest-{secrets.token_hex(6)}"
    yield name
    with contextlib.suppress(posix_ipc.ExistentialError):
        posix_ipc.unlink_shared_memory(name)


def create(key: str, data: bytes) -> dict[str, int]:
    """A new object under ``key`` holding ``data``; its identity as a reference carries it
    (``object_id``: inode number, ``object_dev``: device)."""
    shm = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, mode=0o600, size=len(data))
    try:
        os.pwrite(shm.fd, data, 0)
        info = os.fstat(shm.fd)
        return {"object_id": info.st_ino, "object_dev": info.st_dev}
    finally:
        shm.close_fd()


def replace(key: str, data: bytes) -> dict[str, int]:
    posix_ipc.unlink_shared_memory(key)
    return create(key, data)


def test_a_replaced_object_is_read_as_the_new_one(key: str) -> None:
    regions = ClientRegions()
    first = create(key, b"old!")
    assert bytes(regions.view(key, 0, 4, "IN", **first)) == b"old!"
    second = replace(key, b"new!")
    assert second != first
    assert bytes(regions.view(key, 0, 4, "IN", **second)) == b"new!"
    regions.close()


def test_a_reference_without_an_identity_is_refused(key: str) -> None:
    regions = ClientRegions()
    create(key, b"old!")
    with pytest.raises(ShoalError) as info:
        regions.view(key, 0, 4, "IN")
    assert info.value.code == ErrorCode.INVALID_ARG and "no identity" in info.value.message
    assert len(regions) == 0
    regions.close()


def test_outputs_go_into_the_registered_object_not_its_predecessor(key: str) -> None:
    regions = ClientRegions()
    first = create(key, b"....")
    regions.view(key, 0, 4, "OUT", writable=True, **first)[:] = b"1111"
    second = replace(key, b"....")
    regions.view(key, 0, 4, "OUT", writable=True, **second)[:] = b"2222"
    fd = os.open("/dev/shm" + key, os.O_RDONLY)
    try:
        assert os.pread(fd, 4, 0) == b"2222"
    finally:
        os.close(fd)
    regions.close()


def test_an_identity_the_key_no_longer_names_is_refused(key: str) -> None:
    regions = ClientRegions()
    first = create(key, b"old!")
    replace(key, b"new!")  # before the worker ever mapped the registered object
    with pytest.raises(ShoalError) as info:
        regions.view(key, 0, 4, "IN", **first)
    assert info.value.code == ErrorCode.INVALID_ARG
    assert "'IN'" in info.value.message and key not in info.value.message
    assert len(regions) == 0
    regions.close()


def test_a_registered_object_its_client_removed_is_refused_never_misread(key: str) -> None:
    """Triton keeps serving a registration whose object the client removed (and replaced)
    from its mapping; here that mapping is closed once the object has no name (it would pin
    the memory), and the registration's later requests get INVALID_ARG, never the bytes of
    the object that now carries the key."""
    regions = ClientRegions()
    first = create(key, b"old!")
    assert bytes(regions.view(key, 0, 4, "IN", **first)) == b"old!"
    second = replace(key, b"new!")
    assert bytes(regions.view(key, 0, 4, "IN", **second)) == b"new!"
    assert len(regions) == 2  # mappings are kept by identity: the old one until a refusal
    with pytest.raises(ShoalError) as info:
        regions.view(key, 0, 4, "IN", **first)
    assert info.value.code == ErrorCode.INVALID_ARG
    assert len(regions) == 1  # the refusal closed the removed object's mapping
    regions.close()


def test_a_removed_object_is_refused_at_once_though_still_mapped(key: str) -> None:
    """A registered object its client removed (nothing under the key now) is refused by the
    very next request, whether or not the sweep has closed its mapping yet."""
    regions = ClientRegions()
    first = create(key, b"old!")
    assert bytes(regions.view(key, 0, 4, "IN", **first)) == b"old!"
    posix_ipc.unlink_shared_memory(key)
    with pytest.raises(ShoalError) as info:
        regions.view(key, 0, 4, "IN", **first)
    assert info.value.code == ErrorCode.INVALID_ARG and "'IN'" in info.value.message
    assert len(regions) == 0
    regions.close()


def test_mappings_of_removed_objects_are_closed(key: str) -> None:
    regions = ClientRegions()
    first = create(key, b"old!")
    regions.view(key, 0, 4, "IN", **first)
    regions.drop_unlinked()
    assert len(regions) == 1  # still linked: kept
    posix_ipc.unlink_shared_memory(key)
    regions.drop_unlinked()
    assert len(regions) == 0
    second = create(key, b"new!")
    regions.view(key, 0, 4, "IN", **second)
    posix_ipc.unlink_shared_memory(key)
    other = f"/shmtest-{secrets.token_hex(6)}"
    try:
        regions.view(other, 0, 1, "X", **create(other, b"x"))  # no sweep on a miss
        assert len(regions) == 2
        regions.drop_unlinked()
        assert len(regions) == 1
    finally:
        posix_ipc.unlink_shared_memory(other)
    regions.close()


def test_a_truncated_object_is_refused_by_size(key: str) -> None:
    regions = ClientRegions()
    first = create(key, b"abcdefgh")
    assert bytes(regions.view(key, 4, 4, "IN", **first)) == b"efgh"
    fd = os.open("/dev/shm" + key, os.O_RDWR)
    try:
        os.ftruncate(fd, 4)
    finally:
        os.close(fd)
    with pytest.raises(ShoalError) as info:
        regions.view(key, 4, 4, "IN", **first)
    assert info.value.code == ErrorCode.INVALID_ARG and "smaller" in info.value.message
    regions.close()


def test_calls_from_several_threads_are_serialized(key: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker maps inputs from its main thread while a decoupled model's outputs are
    written (and the sweep runs) elsewhere: a call waits for the one in progress, so no sweep
    ever sees the cache change under it."""
    regions = ClientRegions()
    first = create(key, b"old!")
    regions.view(key, 0, 4, "IN", **first)
    inside, go_on = threading.Event(), threading.Event()
    real_stat = Segment.stat

    def stalled_stat(segment: Segment) -> os.stat_result:
        if threading.current_thread().name == "sweep":
            inside.set()
            go_on.wait(5)
        return real_stat(segment)

    monkeypatch.setattr(Segment, "stat", stalled_stat)
    sweep = threading.Thread(target=regions.drop_unlinked, name="sweep")
    sweep.start()
    assert inside.wait(5)
    read: list[bytes] = []
    reader = threading.Thread(target=lambda: read.append(bytes(regions.view(
        key, 0, 4, "IN", **first))))
    reader.start()
    reader.join(0.2)
    assert reader.is_alive() and not read  # waits for the sweep in progress
    go_on.set()
    sweep.join(5)
    reader.join(5)
    assert read == [b"old!"]
    regions.close()


def test_a_key_swapped_for_a_hard_link_to_another_object_is_neither_read_nor_written(
        key: str) -> None:
    """The worker's own defence (the frontend checks the key too, but the swap can happen
    between its check and the worker's open): the key now names a link to another object (a
    stand-in for a server segment), which is refused before a byte of it is touched."""
    regions = ClientRegions()
    registered = create(key, b"mine")
    other = f"/shmtest-{secrets.token_hex(6)}"
    create(other, b"SECRET")
    try:
        os.unlink("/dev/shm" + key)
        os.link("/dev/shm" + other, "/dev/shm" + key)
        for writable in (False, True):
            with pytest.raises(ShoalError) as info:
                regions.view(key, 0, 4, "IN", writable=writable, **registered)
            assert info.value.code == ErrorCode.INVALID_ARG
            assert "no longer the object that was registered" in info.value.message
        assert len(regions) == 0
        fd = os.open("/dev/shm" + other, os.O_RDONLY)
        try:
            assert os.pread(fd, 6, 0) == b"SECRET"
        finally:
            os.close(fd)
    finally:
        posix_ipc.unlink_shared_memory(other)
    regions.close()


def test_a_second_link_is_refused_at_map_and_at_use(key: str) -> None:
    regions = ClientRegions()
    registered = create(key, b"mine")
    alias = "/dev/shm" + key + "-alias"
    os.link("/dev/shm" + key, alias)
    try:
        with pytest.raises(ShoalError) as info:
            regions.view(key, 0, 4, "IN", **registered)
        assert "more than one link" in info.value.message
        os.unlink(alias)
        assert bytes(regions.view(key, 0, 4, "IN", **registered)) == b"mine"
        os.link("/dev/shm" + key, alias)  # a cached mapping is re-checked at every use
        with pytest.raises(ShoalError) as info:
            regions.view(key, 0, 4, "IN", **registered)
        assert "more than one link" in info.value.message and len(regions) == 0
    finally:
        if os.path.exists(alias):
            os.unlink(alias)
    regions.close()


def test_an_object_another_user_owns_is_refused_unless_allowed(key: str) -> None:
    registered = create(key, b"mine")
    strict = ClientRegions(euid=os.geteuid() + 1)  # as if the object were another user's
    with pytest.raises(ShoalError) as info:
        strict.view(key, 0, 4, "IN", **registered)
    assert "owned by another user" in info.value.message and len(strict) == 0
    allowing = ClientRegions(allow_foreign_owner=True, euid=os.geteuid() + 1)
    assert bytes(allowing.view(key, 0, 4, "IN", **registered)) == b"mine"
    strict.close()
    allowing.close()
