"""shoal.shm.cuda_ipc: the provider hook (``SHOAL_CUDA_IPC_PROVIDER``) that chooses between a
named class and the driver; the test stand-in's handle format and refusals
(tests/fakes/cuda_ipc.py); and the driver's clear failure where no CUDA driver is installed (its
success path needs a GPU: tests/e2e/test_cuda_shm_on_a_gpu.py)."""

from __future__ import annotations

import ctypes.util
import secrets
from collections.abc import Iterator

import posix_ipc
import pytest
import torch

from shoal.errors import ErrorCode, ShoalError
from shoal.shm import cuda_ipc
from shoal.shm.cuda_ipc import (
    IPC_HANDLE_BYTES,
    PROVIDER_ENV,
    CudaIpcError,
    DriverCudaIpc,
    create_cuda_ipc,
    provided_device_count,
)
from tests.fakes.cuda_ipc import PROVIDER, FakeCudaIpc, fake_handle


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


def test_without_a_provider_the_driver_is_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[object] = []

    class Driver:  # stands in for DriverCudaIpc, whose constructor loads libcuda
        def __init__(self) -> None:
            made.append(self)

    monkeypatch.delenv(PROVIDER_ENV, raising=False)
    monkeypatch.setattr(cuda_ipc, "DriverCudaIpc", Driver)
    assert isinstance(create_cuda_ipc(), Driver) and len(made) == 1
    monkeypatch.setenv(PROVIDER_ENV, "")  # empty is unset
    assert isinstance(create_cuda_ipc(), Driver) and len(made) == 2
    assert provided_device_count() is None


def test_the_provider_is_chosen_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROVIDER_ENV, PROVIDER)
    assert isinstance(create_cuda_ipc(), FakeCudaIpc)
    assert provided_device_count() == 1
    monkeypatch.delenv(PROVIDER_ENV)
    assert provided_device_count() is None  # read at each call


def test_a_provider_without_a_device_count_leaves_it_to_torch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROVIDER_ENV, "shoal.shm.cuda_ipc:DriverCudaIpc")
    assert provided_device_count() is None


@pytest.mark.parametrize("value", [
    "nocolon",
    "no.such.module:X",
    ":FakeCudaIpc",
    "tests.fakes.cuda_ipc:",
    "tests.fakes.cuda_ipc:NoSuchName",
    "tests.fakes.cuda_ipc:fake_handle",  # not a class
])
def test_a_bad_provider_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(PROVIDER_ENV, value)
    for call in (provided_device_count, create_cuda_ipc):
        with pytest.raises(ShoalError) as info:
            call()
        assert info.value.code is ErrorCode.INVALID_ARG
        assert "SHOAL_CUDA_IPC_PROVIDER" in str(info.value) and value in str(info.value)


@pytest.mark.parametrize("count", [0, -1, True, "1"])
def test_a_bad_device_count_is_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                             count: object) -> None:
    monkeypatch.setenv(PROVIDER_ENV, PROVIDER)
    monkeypatch.setattr(FakeCudaIpc, "device_count", count)
    with pytest.raises(ShoalError, match=r"SHOAL_CUDA_IPC_PROVIDER.*device_count"):
        provided_device_count()


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None,
                    reason="this machine has a CUDA driver")
def test_without_a_cuda_driver_the_driver_ipc_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROVIDER_ENV, raising=False)
    with pytest.raises(CudaIpcError, match="libcuda"):
        create_cuda_ipc()
    with pytest.raises(CudaIpcError, match="libcuda"):
        DriverCudaIpc()


def test_the_driver_gets_the_handle_bytes_in_its_struct() -> None:
    from shoal.shm.cuda_ipc import IPC_HANDLE_BYTES, ipc_handle_struct

    raw = bytes(range(IPC_HANDLE_BYTES))
    assert bytes(ipc_handle_struct(raw)) == raw
