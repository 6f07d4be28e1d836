"""shoal.shm.cuda_ipc: the fake's handle format and refusals, the choice between fake and driver,
and the driver's clear failure where no CUDA driver is installed (its success path needs a GPU:
tests/e2e/test_cuda_shm_on_a_gpu.py)."""

from __future__ import annotations

import ctypes.util
import secrets
from collections.abc import Iterator

import posix_ipc
import pytest
import torch

from shoal.shm.cuda_ipc import (
    FAKE_ENV,
    IPC_HANDLE_BYTES,
    CudaIpcError,
    DriverCudaIpc,
    FakeCudaIpc,
    create_cuda_ipc,
    fake_handle,
    fake_ipc_enabled,
)


@pytest.fixture
def shm_object() -> Iterator[str]:
    key = f"/cudatest-{secrets.token_hex(6)}"
    memory = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, mode=0o600, size=256)
    memory.close_fd()
    yield key
    posix_ipc.unlink_shared_memory(key)


def test_fake_handles_are_64_bytes_and_name_the_object(shm_object: str) -> None:
    handle = fake_handle(shm_object)
    assert len(handle) == IPC_HANDLE_BYTES
    with pytest.raises(ValueError):
        fake_handle("/" + "x" * 64)


def test_the_fake_maps_the_whole_object_and_writes_reach_it(shm_object: str) -> None:
    opened = FakeCudaIpc().open(fake_handle(shm_object), 0)
    assert opened.tensor.dtype == torch.uint8 and opened.tensor.numel() == 256
    opened.tensor[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    with open("/dev/shm" + shm_object, "rb") as raw:
        assert raw.read(4) == bytes([1, 2, 3, 4])
    close = opened.close
    del opened
    close()


@pytest.mark.parametrize("handle", [
    b"\x00" * IPC_HANDLE_BYTES,  # not a fake handle
    b"short",
    fake_handle("/cudatest-never-created"),
])
def test_the_fake_refuses_what_the_driver_would(handle: bytes) -> None:
    with pytest.raises(CudaIpcError, match="invalid argument"):
        FakeCudaIpc().open(handle, 0)


def test_the_fake_has_one_device(shm_object: str) -> None:
    with pytest.raises(CudaIpcError, match="invalid device ordinal"):
        FakeCudaIpc().open(fake_handle(shm_object), 1)


def test_the_fake_is_chosen_by_the_environment_only(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not fake_ipc_enabled({})
    assert not fake_ipc_enabled({FAKE_ENV: "yes"})
    assert fake_ipc_enabled({FAKE_ENV: "1"})
    monkeypatch.setenv(FAKE_ENV, "1")
    assert isinstance(create_cuda_ipc(), FakeCudaIpc)


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None,
                    reason="this machine has a CUDA driver")
def test_without_a_cuda_driver_the_driver_ipc_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FAKE_ENV, raising=False)
    with pytest.raises(CudaIpcError, match="libcuda"):
        create_cuda_ipc()
    with pytest.raises(CudaIpcError, match="libcuda"):
        DriverCudaIpc()


def test_the_driver_gets_the_handle_bytes_in_its_struct() -> None:
    from shoal.shm.cuda_ipc import IPC_HANDLE_BYTES, ipc_handle_struct

    raw = bytes(range(IPC_HANDLE_BYTES))
    assert bytes(ipc_handle_struct(raw)) == raw
