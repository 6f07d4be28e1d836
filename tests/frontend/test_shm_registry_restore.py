"""The registry reports each registration that starts and ends (the broker keeps them), and a
restarted frontend restores them without their clients registering again."""

from __future__ import annotations

import os

import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.frontend.shm_registry import ClientSharedMemoryRegistry
from shoal.messages import ClientRegion, CudaHandle
from shoal.settings import settings_from_flags
from tests.conftest import MakeObject

ENABLED = settings_from_flags(model_repositories=["/m"], allow_client_shm=True).for_frontends()
HANDLE = b"\x07" * 64


class Reports:
    def __init__(self) -> None:
        self.registered: list[ClientRegion] = []
        self.unregistered: list[str] = []

    def registry(self) -> ClientSharedMemoryRegistry:
        return ClientSharedMemoryRegistry(ENABLED, on_registered=self.registered.append,
                                          on_unregistered=self.unregistered.append)


def test_registrations_are_reported_as_they_start_and_end(make_object: MakeObject) -> None:
    key = make_object(4096)
    reports = Reports()
    registry = reports.registry()
    registry.register("sys", key, 128, 1024)
    registry.register_cuda("gpu", HANDLE, 1, 512, device_count=2)
    info = os.stat("/dev/shm" + key)  # the registered object's identity travels with it
    assert reports.registered == [ClientRegion("sys", key, 128, 1024, object_dev=info.st_dev,
                                               object_ino=info.st_ino),
                                  ClientRegion("gpu", cuda=CudaHandle(HANDLE, 1, 512))]
    with pytest.raises(ShoalError):
        registry.register("sys", key, 0, 16)  # refused: not reported
    assert len(reports.registered) == 2
    registry.unregister("unknown")
    registry.unregister("gpu")  # a CUDA region: not a system one, nothing happens
    assert reports.unregistered == []
    registry.resolve_input(7, "sys", 0, 16, "IN", "FP32", [4])
    registry.unregister(None)  # in use: the name ends now, the object when the request does
    registry.cuda_unregister(None)
    assert reports.unregistered == ["sys", "gpu"]
    registry.release_request(7)
    registry.close()


def test_a_restarted_frontend_restores_its_regions_silently(make_object: MakeObject) -> None:
    key = make_object(4096)
    reports = Reports()
    registry = reports.registry()
    registry.restore(ClientRegion("sys", key, 128, 1024))
    registry.restore(ClientRegion("gpu", cuda=CudaHandle(HANDLE, 3, 512)))  # no device probe
    assert reports.registered == []
    (status,) = registry.status("sys")
    assert (status.key, status.offset, status.byte_size) == (key, 128, 1024)
    assert [s.device_id for s in registry.cuda_status(None)] == [3]
    ref = registry.resolve_input(1, "sys", 16, 16, "IN", "FP32", [4])
    assert (ref.region, ref.offset, ref.nbytes) == (key, 128 + 16, 16)
    registry.release_request(1)
    with pytest.raises(ShoalError) as taken:
        registry.restore(ClientRegion("sys", key, 0, 16))
    assert taken.value.code is ErrorCode.ALREADY_EXISTS
    registry.close()


def test_a_region_whose_object_is_gone_cannot_be_restored(make_object: MakeObject) -> None:
    key = make_object(64)
    os.unlink("/dev/shm" + key)  # the client removed its object while the frontend was down
    registry = Reports().registry()
    with pytest.raises(ShoalError):
        registry.restore(ClientRegion("sys", key, 0, 64))
    assert registry.status(None) == []
    registry.close()


def test_a_region_whose_key_names_another_object_now_is_not_restored(
        make_object: MakeObject) -> None:
    """The broker kept the registered object's identity: a frontend restarted after the key
    was given to another object (here one with the same content) refuses to take it over."""
    key = make_object(64)
    info = os.stat("/dev/shm" + key)
    kept = ClientRegion("sys", key, 0, 64, object_dev=info.st_dev, object_ino=info.st_ino)
    os.rename("/dev/shm" + key, "/dev/shm" + key + "-old")
    try:
        with open("/dev/shm" + key, "wb") as replacement:
            replacement.write(b"\0" * 64)
        registry = Reports().registry()
        with pytest.raises(ShoalError) as refused:
            registry.restore(kept)
        assert refused.value.code is ErrorCode.INVALID_ARG
        assert "'sys'" in refused.value.message
        assert registry.status(None) == []
        registry.close()
    finally:
        os.unlink("/dev/shm" + key + "-old")
