"""Client system shared memory is served by identity, not by name (issue 26 part 2), end to end:
a real server with --allow-client-shm, tritonclient over HTTP, real POSIX objects in /dev/shm.

A registration is of one object (its st_dev and st_ino); a key swapped for a hard link to the
server's own arena, an object with a second link, or one another user owns is refused with a
400 naming the region, and nothing of the server's memory is read or written; a region
registered again over a new object under the same key is served from the new object, never
from a mapping of the old one. Every test ends with the server live and no worker restarted."""

from __future__ import annotations

import glob
import hashlib
import os
import pathlib
from collections.abc import Callable, Iterator

import numpy as np
import posix_ipc
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import MakeObject
from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

FOREIGN_UID = 4321  # a uid nobody on the test machine runs the server as


@pytest.fixture
def client(shm_server: ShoalServer) -> Iterator[httpclient.InferenceServerClient]:
    workers = sorted(shm_server.worker_pids())
    triton = httpclient.InferenceServerClient(shm_server.url)
    yield triton
    triton.unregister_system_shared_memory()
    assert triton.get_system_shared_memory_status() == []
    assert triton.is_server_live()
    assert sorted(shm_server.worker_pids()) == workers, "a worker restarted"
    triton.close()


@pytest.fixture(scope="module")
def foreign_owner_server(standard_repo: pathlib.Path) -> Iterator[ShoalServer]:
    with serving(ShoalServer([str(standard_repo)], [
            "--allow-client-shm=true", "--client-shm-allow-foreign-owner=true"])) as srv:
        yield srv


def path_of(key: str) -> str:
    return "/dev/shm" + key


def pwrite(key: str, offset: int, data: bytes) -> None:
    fd = os.open(path_of(key), os.O_RDWR)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def pread(key: str, offset: int, nbytes: int) -> bytes:
    fd = os.open(path_of(key), os.O_RDONLY)
    try:
        return os.pread(fd, nbytes, offset)
    finally:
        os.close(fd)


def digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.blake2b(f.read()).hexdigest()


def frontend_arena(server: ShoalServer) -> str:
    """The path of the frontend's first input-arena segment (``shoal-<id>-fe<pid>-0``)."""
    (pid,) = server.frontend_pids()
    (path,) = glob.glob(f"/dev/shm/shoal-*-fe{pid}-0")
    return path


def refusal(call: Callable[[], object]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def fp32_input(region: str, values: int = 4) -> httpclient.InferInput:
    inp = httpclient.InferInput("IN_FP32", [values], "FP32")
    inp.set_shared_memory(region, 4 * values)
    return inp


def test_a_key_swapped_for_a_hard_link_to_the_server_arena_is_refused(
        shm_server: ShoalServer, client: httpclient.InferenceServerClient,
        make_object: MakeObject) -> None:
    """Register clean objects, then put a hard link to the frontend's arena under their keys:
    the input is not read from the arena (another client's tensor is there) and the output is
    not written into it; both requests fail with 400 naming the region."""
    secret = np.full(4, 1234.5, dtype=np.float32)  # another client's input, through the arena
    other = httpclient.InferInput("IN_FP32", [4], "FP32")
    other.set_data_from_numpy(secret)
    assert np.array_equal(client.infer("identity_all", [other]).as_numpy("OUT_FP32"), secret)

    in_key, out_key, clean_key = make_object(4096), make_object(4096), make_object(4096)
    client.register_system_shared_memory("swapped_in", in_key, 4096)
    client.register_system_shared_memory("swapped_out", out_key, 4096)
    client.register_system_shared_memory("clean_in", clean_key, 4096)
    arena = frontend_arena(shm_server)
    for key in (in_key, out_key):
        os.unlink(path_of(key))
        os.link(arena, path_of(key))
    try:
        before = digest(arena)
        error = refusal(lambda: client.infer("identity_all", [fp32_input("swapped_in")]))
        assert error.status() == "400"
        assert "'swapped_in'" in error.message() and "registered" in error.message()
        assert "1234.5" not in error.message()

        out = httpclient.InferRequestedOutput("OUT_FP32")
        out.set_shared_memory("swapped_out", 16)
        error = refusal(lambda: client.infer("identity_all", [fp32_input("clean_in")],
                                             outputs=[out]))
        assert error.status() == "400" and "'swapped_out'" in error.message()
        assert digest(arena) == before, "the server's arena was written"
    finally:
        for key in (in_key, out_key):
            os.unlink(path_of(key))  # the link only; the arena keeps its own name
    assert os.path.exists(arena)


def test_an_object_with_a_second_link_is_refused(
        client: httpclient.InferenceServerClient, make_object: MakeObject) -> None:
    """At registration, and at use once a second link appears after it."""
    key = make_object(4096)
    alias = key + "-alias"
    os.link(path_of(key), path_of(alias))
    try:
        error = refusal(lambda: client.register_system_shared_memory("linked", key, 4096))
        assert error.status() == "400" and "more than one link" in error.message()
        assert client.get_system_shared_memory_status() == []
        os.unlink(path_of(alias))
        client.register_system_shared_memory("linked", key, 4096)
        os.link(path_of(key), path_of(alias))
        error = refusal(lambda: client.infer("identity_all", [fp32_input("linked")]))
        assert error.status() == "400"
        assert "'linked'" in error.message() and "more than one link" in error.message()
    finally:
        if os.path.exists(path_of(alias)):
            os.unlink(path_of(alias))


def test_a_region_registered_again_over_a_new_object_never_serves_the_old_mapping(
        client: httpclient.InferenceServerClient, make_object: MakeObject) -> None:
    """The worker maps by identity: after unregister, unlink, create and register again under
    the same name and key, inputs come from the new object and outputs go into it, while the
    old object (still open here) is neither read nor written."""
    key, out_key = make_object(64), make_object(64)
    old_in = np.arange(4, dtype=np.float32)
    pwrite(key, 0, old_in.tobytes())
    for region, k in (("stale_in", key), ("stale_out", out_key)):
        client.register_system_shared_memory(region, k, 64)
    out = httpclient.InferRequestedOutput("OUT_FP32")
    out.set_shared_memory("stale_out", 16)
    client.infer("identity_all", [fp32_input("stale_in")], outputs=[out])
    assert pread(out_key, 0, 16) == old_in.tobytes()

    old_in_fd, old_out_fd = os.open(path_of(key), os.O_RDWR), os.open(path_of(out_key), os.O_RDWR)
    try:
        client.unregister_system_shared_memory("stale_in")
        client.unregister_system_shared_memory("stale_out")
        for k in (key, out_key):  # new objects under the same keys (tritonclient's examples)
            posix_ipc.unlink_shared_memory(k)
            posix_ipc.SharedMemory(k, posix_ipc.O_CREX, mode=0o600, size=64).close_fd()
        new_in = np.full(4, -7.0, dtype=np.float32)
        pwrite(key, 0, new_in.tobytes())
        for region, k in (("stale_in", key), ("stale_out", out_key)):
            client.register_system_shared_memory(region, k, 64)
        client.infer("identity_all", [fp32_input("stale_in")], outputs=[out])
        assert pread(out_key, 0, 16) == new_in.tobytes()
        assert os.pread(old_out_fd, 16, 0) == old_in.tobytes(), "the old object was written"
        assert os.pread(old_in_fd, 16, 0) == old_in.tobytes()
    finally:
        os.close(old_in_fd)
        os.close(old_out_fd)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving an object to another uid "
                                "needs root (the unit tests check the owner with a fake fstat)")


@needs_root
def test_an_object_another_user_owns_is_refused_by_default(
        client: httpclient.InferenceServerClient, make_object: MakeObject) -> None:
    key = make_object(4096)
    os.chown(path_of(key), FOREIGN_UID, FOREIGN_UID)
    error = refusal(lambda: client.register_system_shared_memory("foreign", key, 4096))
    assert error.status() == "400"
    assert "'foreign'" in error.message() and "--client-shm-allow-foreign-owner" in error.message()
    assert client.get_system_shared_memory_status() == []

    mine = make_object(4096)  # given away after registration: refused at use
    client.register_system_shared_memory("given_away", mine, 4096)
    os.chown(path_of(mine), FOREIGN_UID, FOREIGN_UID)
    error = refusal(lambda: client.infer("identity_all", [fp32_input("given_away")]))
    assert error.status() == "400" and "'given_away'" in error.message()


@needs_root
def test_the_flag_allows_objects_another_user_owns(
        foreign_owner_server: ShoalServer, make_object: MakeObject) -> None:
    """--client-shm-allow-foreign-owner=true reaches the frontend and the worker: a foreign
    object is registered, read and written (a hard link is still refused)."""
    triton = httpclient.InferenceServerClient(foreign_owner_server.url)
    try:
        key, out_key = make_object(64), make_object(64)
        data = np.array([1.5, 2.5, 3.5, 4.5], dtype=np.float32)
        pwrite(key, 0, data.tobytes())
        for k in (key, out_key):
            os.chown(path_of(k), FOREIGN_UID, FOREIGN_UID)
        triton.register_system_shared_memory("foreign_in", key, 64)
        triton.register_system_shared_memory("foreign_out", out_key, 64)
        out = httpclient.InferRequestedOutput("OUT_FP32")
        out.set_shared_memory("foreign_out", 16)
        triton.infer("identity_all", [fp32_input("foreign_in")], outputs=[out])
        assert pread(out_key, 0, 16) == data.tobytes()

        linked = make_object(64)
        os.link(path_of(linked), path_of(linked) + "-alias")
        try:
            error = refusal(lambda: triton.register_system_shared_memory("l", linked, 64))
            assert error.status() == "400" and "more than one link" in error.message()
        finally:
            os.unlink(path_of(linked) + "-alias")
        triton.unregister_system_shared_memory()
        assert triton.is_server_live()
    finally:
        triton.close()
