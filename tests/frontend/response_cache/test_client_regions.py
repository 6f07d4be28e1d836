"""The registry's pread / pwrite access to client system regions that the response cache uses
(a hit's outputs written into the client's region, a miss's read back from it)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from shoal.errors import ShoalError
from shoal.frontend.shm_registry import ClientSharedMemoryRegistry
from shoal.settings import settings_from_flags
from tests.conftest import MakeObject


@pytest.fixture
def registry() -> Iterator[ClientSharedMemoryRegistry]:
    reg = ClientSharedMemoryRegistry(settings_from_flags(model_repositories=["/m"],
                                                         allow_client_shm=True).for_frontends())
    yield reg
    reg.close()


def _object_bytes(key: str) -> bytes:
    with open("/dev/shm" + key, "rb") as f:
        return f.read()


def test_writes_and_reads_land_at_the_registered_offset(
        registry: ClientSharedMemoryRegistry, make_object: MakeObject) -> None:
    key = make_object(64)
    registry.register("out", key, 16, 32)
    target = registry.resolve_output(7, "out", 8, 8, "OUT")
    assert target.offset == 24
    registry.write_system(7, target.region, target.offset, memoryview(b"ABCDEFGH"))
    assert _object_bytes(key)[24:32] == b"ABCDEFGH"
    assert registry.read_system(7, target.region, target.offset, 8) == b"ABCDEFGH"
    registry.release_request(7)  # the request ended: still readable through the registration
    assert registry.read_system(7, target.region, target.offset, 8) == b"ABCDEFGH"


def test_a_request_without_the_region_cannot_write_it(
        registry: ClientSharedMemoryRegistry, make_object: MakeObject) -> None:
    key = make_object(64)
    registry.register("out", key, 0, 64)
    target = registry.resolve_output(1, "out", 0, 8, "OUT")
    with pytest.raises(ShoalError, match="no longer available"):
        registry.write_system(2, target.region, target.offset, memoryview(b"x" * 8))


def test_a_truncated_object_is_neither_written_nor_read(
        registry: ClientSharedMemoryRegistry, make_object: MakeObject) -> None:
    key = make_object(64)
    registry.register("out", key, 0, 64)
    target = registry.resolve_output(1, "out", 32, 32, "OUT")
    fd = os.open("/dev/shm" + key, os.O_RDWR)
    try:
        os.ftruncate(fd, 40)
    finally:
        os.close(fd)
    with pytest.raises(ShoalError, match="truncated"):
        registry.write_system(1, target.region, target.offset, memoryview(b"y" * 32))
    assert len(_object_bytes(key)) == 40  # not grown by the write
    assert registry.read_system(1, target.region, target.offset, 32) is None


def test_an_unregistered_object_is_not_read(
        registry: ClientSharedMemoryRegistry, make_object: MakeObject) -> None:
    key = make_object(64)
    registry.register("out", key, 0, 64)
    target = registry.resolve_output(1, "out", 0, 8, "OUT")
    registry.release_request(1)
    registry.unregister("out")
    assert registry.read_system(1, target.region, 0, 8) is None
