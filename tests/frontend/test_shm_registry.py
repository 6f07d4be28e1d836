"""ClientSharedMemoryRegistry against real POSIX shm objects (``/shmtest-<random>``, unlinked after
each test) and, for the odd cases (FIFOs, links), files in a temporary directory standing in for
/dev/shm."""

from __future__ import annotations

import os
import pathlib
import secrets
import struct
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.frontend.core.decoded import DecodedInput, DecodedRequest
from shoal.frontend.core.prepare import prepare_request
from shoal.frontend.core.shm_params import SharedMemorySlice
from shoal.frontend.core.validation import validate_request
from shoal.frontend.shm_contract import RegionStatus
from shoal.frontend.shm_registry import ClientSharedMemoryRegistry
from shoal.messages import OutputTarget, TensorSpec
from shoal.settings import settings_from_flags
from tests.conftest import MakeObject
from tests.frontend.http.fakes import make_model

ENABLED = settings_from_flags(model_repositories=["/m"], allow_client_shm=True).for_frontends()


@pytest.fixture
def registry() -> Iterator[ClientSharedMemoryRegistry]:
    reg = ClientSharedMemoryRegistry(ENABLED)
    yield reg
    reg.close()


def error_of(call: Callable[[], object]) -> ShoalError:
    with pytest.raises(ShoalError) as info:
        call()
    return info.value


def open_fds_on(key: str) -> int:
    """How many descriptors of this process refer to /dev/shm<key>."""
    target = "/dev/shm" + key
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                count += 1
        except OSError:
            continue
    return count


def write(key: str, offset: int, data: bytes) -> None:
    fd = os.open("/dev/shm" + key, os.O_RDWR)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- enabling


def test_disabled_registry_refuses_everything_but_status(make_object: MakeObject) -> None:
    registry = ClientSharedMemoryRegistry(
        settings_from_flags(model_repositories=["/m"]).for_frontends())
    key = make_object(64)
    for call in (lambda: registry.register("r", key, 0, 64), lambda: registry.unregister("r"),
                 lambda: registry.unregister(None),
                 lambda: registry.resolve_input(1, "r", 0, 4, "X", "FP32", [1]),
                 lambda: registry.resolve_output(1, "r", 0, 4, "Y")):
        error = error_of(call)
        assert error.code is ErrorCode.UNSUPPORTED
        assert "--allow-client-shm" in error.message
    assert registry.status(None) == []
    registry.release_request(1)  # harmless
    assert open_fds_on(key) == 0


def test_several_frontend_processes_refuse_registration(make_object: MakeObject) -> None:
    settings = settings_from_flags(model_repositories=["/m"], allow_client_shm=True,
                                   http_workers=2).for_frontends()
    registry = ClientSharedMemoryRegistry(settings)
    error = error_of(lambda: registry.register("r", make_object(64), 0, 64))
    assert error.code is ErrorCode.UNSUPPORTED and "--http-workers=1" in error.message


# ---------------------------------------------------------------- register / status / unregister


def test_register_status_and_unregister(registry: ClientSharedMemoryRegistry,
                                        make_object: MakeObject) -> None:
    key_a, key_b = make_object(4096), make_object(100)
    registry.register("b", key_b, 0, 100)
    registry.register("a", key_a, 1024, 2048)
    assert registry.status(None) == [RegionStatus("a", key_a, 1024, 2048),
                                     RegionStatus("b", key_b, 0, 100)]
    assert registry.status("b") == [RegionStatus("b", key_b, 0, 100)]
    registry.unregister("a")
    assert [s.name for s in registry.status(None)] == ["b"]
    assert open_fds_on(key_a) == 0 and open_fds_on(key_b) == 1
    registry.unregister("never-registered")  # Triton: not an error
    registry.unregister(None)
    assert registry.status(None) == [] and open_fds_on(key_b) == 0


def test_status_of_an_unknown_region_is_not_found(registry: ClientSharedMemoryRegistry) -> None:
    error = error_of(lambda: registry.status("nope"))
    assert error.code is ErrorCode.NOT_FOUND and "'nope'" in error.message


def test_a_name_can_be_registered_once(registry: ClientSharedMemoryRegistry,
                                       make_object: MakeObject) -> None:
    key = make_object(64)
    registry.register("r", key, 0, 64)
    error = error_of(lambda: registry.register("r", key, 0, 32))
    assert error.code is ErrorCode.ALREADY_EXISTS and "'r'" in error.message
    registry.register("r2", key, 32, 32)  # one object under two names is fine
    assert len(registry.status(None)) == 2


@pytest.mark.parametrize("spelling", ["{body}", "/{body}", "//{body}"])
def test_key_spellings_name_the_same_object(registry: ClientSharedMemoryRegistry,
                                            make_object: MakeObject, spelling: str) -> None:
    key = make_object(16)
    given = spelling.format(body=key[1:])
    registry.register("r", given, 0, 16)
    assert registry.status("r")[0].key == given  # shown as given
    ref = registry.resolve_input(1, "r", 0, 16, "X", "FP32", [4])
    assert ref.region == key  # canonical "/<name>" for the worker


@pytest.mark.parametrize("key", [
    "/shoal-0123456789ab-fe12-0", "shoal-0123456789ab-fe12-0", "//shoal-0123456789ab-w-3",
    "/shoal-0123456789ab.lock", "/shoal-",
])
def test_internal_segments_cannot_be_registered_and_are_not_echoed(
        registry: ClientSharedMemoryRegistry, key: str) -> None:
    error = error_of(lambda: registry.register("r", key, 0, 16))
    assert error.code is ErrorCode.INVALID_ARG and "'r'" in error.message
    assert "shoal-" not in error.message and "/dev/shm" not in error.message


@pytest.mark.parametrize("key", ["/", "///", "", "/a/b", "/..", "/.", "/a\x00b", "/" + "k" * 256])
def test_invalid_keys_are_refused(registry: ClientSharedMemoryRegistry, key: str) -> None:
    error = error_of(lambda: registry.register("r", key, 0, 16))
    assert error.code is ErrorCode.INVALID_ARG and "'key'" in error.message


def test_a_missing_object_is_a_clear_error(registry: ClientSharedMemoryRegistry) -> None:
    key = f"/shmtest-{secrets.token_hex(6)}"
    error = error_of(lambda: registry.register("r", key, 0, 16))
    assert error.code is ErrorCode.INVALID_ARG
    assert key in error.message and "no such shared memory object" in error.message


def test_region_name_is_required(registry: ClientSharedMemoryRegistry,
                                 make_object: MakeObject) -> None:
    key = make_object(16)
    assert "region name" in error_of(lambda: registry.register("", key, 0, 16)).message
    assert "longer" in error_of(lambda: registry.register("n" * 2000, key, 0, 16)).message


@pytest.mark.parametrize("offset,byte_size", [
    (0, 4097), (4096, 1), (1, 4096), (2**63 - 1, 1), (1, 2**63 - 1), (2**64 - 1, 2**64 - 1),
    (0, 0), (-1, 16), (0, -16),
])
def test_registration_must_lie_inside_the_object(registry: ClientSharedMemoryRegistry,
                                                 make_object: MakeObject, offset: int,
                                                 byte_size: int) -> None:
    key = make_object(4096)
    error = error_of(lambda: registry.register("r", key, offset, byte_size))
    assert error.code is ErrorCode.INVALID_ARG and "'r'" in error.message
    assert registry.status(None) == [] and open_fds_on(key) == 0


def test_caps_on_region_count_and_bytes(make_object: MakeObject) -> None:
    settings = settings_from_flags(model_repositories=["/m"], allow_client_shm=True,
                                   client_shm_max_regions=2,
                                   client_shm_max_bytes=100).for_frontends()
    registry = ClientSharedMemoryRegistry(settings)
    key = make_object(100)
    try:
        registry.register("a", key, 0, 60)
        error = error_of(lambda: registry.register("b", key, 0, 41))
        assert error.code is ErrorCode.UNAVAILABLE and "--client-shm-max-bytes" in error.message
        registry.register("b", key, 0, 40)
        error = error_of(lambda: registry.register("c", key, 0, 1))
        assert error.code is ErrorCode.UNAVAILABLE and "--client-shm-max-regions" in error.message
        registry.unregister("a")
        registry.register("c", key, 0, 60)
    finally:
        registry.close()
    assert open_fds_on(key) == 0


# ---------------------------------------------------------------- odd objects (temporary dir)


@pytest.fixture
def fake_shm_dir(tmp_path: pathlib.Path) -> Iterator[tuple[ClientSharedMemoryRegistry,
                                                          pathlib.Path]]:
    registry = ClientSharedMemoryRegistry(ENABLED, shm_directory=str(tmp_path))
    yield registry, tmp_path
    registry.close()


def test_a_fifo_is_refused_without_blocking(fake_shm_dir: tuple[ClientSharedMemoryRegistry,
                                                                pathlib.Path]) -> None:
    registry, directory = fake_shm_dir
    os.mkfifo(directory / "pipe")
    error = error_of(lambda: registry.register("r", "/pipe", 0, 1))
    assert "does not name a shared memory object" in error.message


def test_links_are_refused(fake_shm_dir: tuple[ClientSharedMemoryRegistry,
                                               pathlib.Path]) -> None:
    registry, directory = fake_shm_dir
    (directory / "real").write_bytes(b"\0" * 64)
    os.symlink(directory / "real", directory / "soft")
    os.link(directory / "real", directory / "hard")
    assert "symbolic link" in error_of(lambda: registry.register("s", "/soft", 0, 8)).message
    assert "more than one link" in error_of(lambda: registry.register("h", "/hard", 0, 8)).message


# ---------------------------------------------------------------- use by requests


def test_resolve_input_points_into_the_object(registry: ClientSharedMemoryRegistry,
                                              make_object: MakeObject) -> None:
    key = make_object(4096)
    registry.register("r", key, 1000, 2000)
    ref = registry.resolve_input(7, "r", 16, 24, "X", "FP32", [2, 3])
    assert (ref.name, ref.datatype, ref.shape) == ("X", "FP32", [2, 3])
    assert (ref.region, ref.offset, ref.nbytes) == (key, 1016, 24)
    info = os.stat("/dev/shm" + key)  # workers read only the registered object
    assert (ref.object_dev, ref.object_id) == (info.st_dev, info.st_ino)
    target = registry.resolve_output(7, "r", 1000, 1000, "Y")
    assert target == OutputTarget(key, 2000, 1000, object_id=info.st_ino,
                                  object_dev=info.st_dev)


def test_unknown_region_names_region_and_tensor(registry: ClientSharedMemoryRegistry) -> None:
    error = error_of(lambda: registry.resolve_input(1, "ghost", 0, 4, "X", "FP32", [1]))
    assert error.code is ErrorCode.NOT_FOUND
    assert "'ghost'" in error.message and "'X'" in error.message
    error = error_of(lambda: registry.resolve_output(1, "ghost", 0, 4, "Y"))
    assert "'Y'" in error.message


@pytest.mark.parametrize("offset,byte_size", [
    (0, 101), (100, 4), (97, 4), (2**63 - 1, 4), (4, 2**63 - 1), (2**64 - 1, 2**64 - 1),
    (-4, 4), (0, -4),
])
def test_slices_past_the_region_are_refused(registry: ClientSharedMemoryRegistry,
                                            make_object: MakeObject, offset: int,
                                            byte_size: int) -> None:
    key = make_object(4096)
    registry.register("r", key, 0, 100)  # the object is larger than the region
    for call in (lambda: registry.resolve_output(1, "r", offset, byte_size, "Y"),
                 lambda: registry.resolve_input(1, "r", offset, byte_size, "X", "UINT8",
                                                [max(byte_size, 0)])):
        error = error_of(call)
        assert error.code is ErrorCode.INVALID_ARG and "'r'" in error.message
    registry.unregister("r")
    assert open_fds_on(key) == 0  # nothing was marked in use


def test_input_byte_size_must_match_the_tensor(registry: ClientSharedMemoryRegistry,
                                               make_object: MakeObject) -> None:
    key = make_object(64)
    registry.register("r", key, 0, 64)
    error = error_of(lambda: registry.resolve_input(1, "r", 0, 12, "X", "FP32", [4]))
    assert error.code is ErrorCode.INVALID_ARG
    assert "'X'" in error.message and "16" in error.message and "12" in error.message


def test_a_truncated_object_is_an_error_not_a_crash(registry: ClientSharedMemoryRegistry,
                                                    make_object: MakeObject) -> None:
    key = make_object(4096)
    registry.register("r", key, 0, 4096)
    registry.resolve_input(1, "r", 2048, 16, "X", "FP32", [4])
    os.truncate("/dev/shm" + key, 1024)
    error = error_of(lambda: registry.resolve_input(2, "r", 2048, 16, "X", "FP32", [4]))
    assert error.code is ErrorCode.INVALID_ARG and "truncated" in error.message
    assert "'X'" in error.message and "1024" in error.message
    assert registry.resolve_output(3, "r", 0, 1024, "Y").nbytes == 1024  # still inside


def frame(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def test_bytes_inputs_are_checked_for_framing(registry: ClientSharedMemoryRegistry,
                                              make_object: MakeObject) -> None:
    key = make_object(256)
    good = frame(b"alpha", b"", b"\x00\xff")
    write(key, 8, good)
    registry.register("r", key, 8, 200)
    ref = registry.resolve_input(1, "r", 0, len(good), "S", "BYTES", [3])
    assert (ref.offset, ref.nbytes) == (8, len(good))
    for shape, nbytes, needle in [([2], len(good), "unexpected number of string elements"),
                                  ([4], len(good), "expected 4 string elements"),
                                  ([3], len(good) - 1, "incomplete string data"),
                                  ([3], len(good) + 2, "incomplete string length")]:
        error = error_of(lambda s=shape, n=nbytes: registry.resolve_input(
            1, "r", 0, n, "S", "BYTES", s))
        assert needle in error.message and "'S'" in error.message


def test_bytes_framing_spanning_read_chunks(registry: ClientSharedMemoryRegistry,
                                            make_object: MakeObject) -> None:
    items = [bytes([i % 251]) * (i * 37 % 3000) for i in range(1200)]
    data = frame(*items)
    assert len(data) > 1 << 20  # more than one read chunk
    key = make_object(len(data))
    write(key, 0, data)
    registry.register("r", key, 0, len(data))
    registry.resolve_input(1, "r", 0, len(data), "S", "BYTES", [len(items)])
    error = error_of(lambda: registry.resolve_input(1, "r", 0, len(data), "S", "BYTES",
                                                    [len(items) + 1]))
    assert "expected" in error.message


class _Plane:
    """What prepare_request uses of a DataPlane for an input in client shared memory."""

    def __init__(self, registry: ClientSharedMemoryRegistry) -> None:
        self.shared_memory = registry

    def next_request_id(self) -> int:
        return 1

    def free(self, slot: object) -> None:
        raise AssertionError("no slot is allocated for an input in shared memory")


@pytest.mark.parametrize("data,count", [
    (frame(b"a"), 3), (frame(b"a", b"b", b"c", b"d"), 3),
    (frame(b"a", b"b") + b"\x01\x00", 3), (frame(b"a", b"b") + struct.pack("<I", 10) + b"xy", 3),
])
@pytest.mark.parametrize("client_id", ["req-7", ""])
def test_bytes_framing_errors_in_shared_memory_read_as_in_the_body(
        registry: ClientSharedMemoryRegistry, make_object: MakeObject, data: bytes, count: int,
        client_id: str) -> None:
    """The same broken BYTES data gives the same text (request id, model, Triton's wording)
    whether it came in the request body or in a client's region."""
    model = make_model("strings", [TensorSpec("S", "BYTES", [-1])])
    in_body = DecodedRequest([DecodedInput("S", "BYTES", [count], memoryview(data), count)],
                             client_id=client_id)
    body_error = error_of(lambda: validate_request(in_body, model))
    key = make_object(256)
    write(key, 0, data)
    registry.register("r", key, 0, 256)
    in_region = DecodedRequest([DecodedInput("S", "BYTES", [count], memoryview(b""), count,
                                             SharedMemorySlice("r", 0, len(data)))],
                               client_id=client_id)
    plan = validate_request(in_region, model)
    plane: Any = _Plane(registry)
    shm_error = error_of(lambda: prepare_request(plane, in_region, plan, model))
    assert (shm_error.code, shm_error.message) == (body_error.code, body_error.message)
    registry.unregister("r")  # the refused request left the region unused: it goes now
    assert registry.status(None) == []


# ---------------------------------------------------------------- deferred unregister


def test_unregister_while_in_use_is_deferred_until_the_request_ends(
        registry: ClientSharedMemoryRegistry, make_object: MakeObject) -> None:
    key = make_object(64)
    registry.register("r", key, 0, 64)
    registry.resolve_input(1, "r", 0, 16, "X", "FP32", [4])
    registry.resolve_output(1, "r", 16, 16, "Y")  # same region twice in one request
    registry.resolve_output(2, "r", 32, 16, "Y")
    registry.unregister("r")
    assert registry.status(None) == []
    assert error_of(lambda: registry.resolve_output(3, "r", 0, 4, "Y")).code is ErrorCode.NOT_FOUND
    assert open_fds_on(key) == 1  # still open for requests 1 and 2
    registry.register("r", key, 0, 32)  # the name is free again at once
    assert open_fds_on(key) == 2
    registry.release_request(1)
    assert open_fds_on(key) == 2
    registry.release_request(2)
    assert open_fds_on(key) == 1  # the old registration closed; the new one stays
    registry.release_request(2)  # idempotent
    assert registry.status("r") == [RegionStatus("r", key, 0, 32)]


def test_a_retiring_region_still_counts_against_the_caps(make_object: MakeObject) -> None:
    settings = settings_from_flags(model_repositories=["/m"], allow_client_shm=True,
                                   client_shm_max_regions=1).for_frontends()
    registry = ClientSharedMemoryRegistry(settings)
    key = make_object(64)
    try:
        registry.register("r", key, 0, 64)
        registry.resolve_output(1, "r", 0, 64, "Y")
        registry.unregister("r")
        assert error_of(lambda: registry.register("s", key, 0, 8)).code is ErrorCode.UNAVAILABLE
        registry.release_request(1)
        registry.register("s", key, 0, 8)
    finally:
        registry.close()
    assert open_fds_on(key) == 0


def test_close_releases_every_object(make_object: MakeObject) -> None:
    registry = ClientSharedMemoryRegistry(ENABLED)
    keys = [make_object(32) for _ in range(3)]
    for i, key in enumerate(keys):
        registry.register(f"r{i}", key, 0, 32)
    registry.resolve_input(1, "r0", 0, 4, "X", "INT32", [1])
    registry.unregister("r0")
    registry.close()
    assert [open_fds_on(k) for k in keys] == [0, 0, 0]
