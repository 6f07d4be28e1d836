"""The CUDA shared-memory RPCs over a real grpc.aio server and a real registry (no GPU: the
test stand-in for CUDA IPC, ``tests.fakes.cuda_ipc`` plugged in by ``SHOAL_CUDA_IPC_PROVIDER``,
gives the server one device; a patched probe stands in for torch): the checks and texts are the
HTTP endpoint's."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from shoal.frontend import cuda_shm
from shoal.frontend.grpc.service import CUDA_SHM_NO_DEVICE
from shoal.frontend.shm_contract import DISABLED_MESSAGE
from shoal.frontend.shm_registry import ClientSharedMemoryRegistry
from shoal.messages import CudaHandle
from shoal.settings import settings_from_flags
from shoal.shm.cuda_ipc import PROVIDER_ENV
from tests.fakes.cuda_ipc import PROVIDER
from tests.frontend.grpc.fakes import StreamingFakeDataPlane
from tests.frontend.grpc.test_service import rpc_error, serve
from tests.frontend.http.fakes import make_model


@dataclass
class CudaShmDataPlane(StreamingFakeDataPlane):
    """The gRPC fakes' DataPlane over a real registry that records what it forgets."""

    allow_client_shm: bool = True
    forgotten: list[list[CudaHandle]] = field(default_factory=list)
    real_registry: ClientSharedMemoryRegistry = field(init=False)

    def __post_init__(self) -> None:
        settings = settings_from_flags(model_repositories=["/m"],
                                       allow_client_shm=self.allow_client_shm).for_frontends()
        self.real_registry = ClientSharedMemoryRegistry(settings,
                                                        on_cuda_forget=self.forgotten.append)

    @property
    def shared_memory(self) -> Any:
        return self.real_registry


def make_dataplane(allow_client_shm: bool = True) -> CudaShmDataPlane:
    return CudaShmDataPlane(models=[make_model("identity")], allow_client_shm=allow_client_shm)


def register_request(name: str, raw_handle: bytes, device_id: int = 0,
                     byte_size: int = 64) -> Any:
    return pb.CudaSharedMemoryRegisterRequest(name=name, raw_handle=raw_handle,
                                              device_id=device_id, byte_size=byte_size)


@pytest.fixture
def fake_ipc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROVIDER_ENV, PROVIDER)


def test_register_status_unregister(fake_ipc: None) -> None:
    dataplane = make_dataplane()
    raw_a, raw_b = secrets.token_bytes(64), secrets.token_bytes(64)

    async def test(stub: Any, channel: Any) -> None:
        await stub.CudaSharedMemoryRegister(register_request("a", raw_a, byte_size=4096))
        await stub.CudaSharedMemoryRegister(register_request("b", raw_b, byte_size=8))
        status = await stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest())
        assert {name: (r.name, r.device_id, r.byte_size) for name, r in status.regions.items()
                } == {"a": ("a", 0, 4096), "b": ("b", 0, 8)}
        one = await stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest(name="b"))
        assert list(one.regions) == ["b"]
        error = await rpc_error(stub.CudaSharedMemoryStatus(
            pb.CudaSharedMemoryStatusRequest(name="x")))
        assert (error.code(), error.details()) == (
            grpc.StatusCode.NOT_FOUND, "Unable to find cuda shared memory region: 'x'")
        error = await rpc_error(stub.CudaSharedMemoryRegister(register_request("a", raw_a)))
        assert error.code() == grpc.StatusCode.ALREADY_EXISTS
        await stub.CudaSharedMemoryUnregister(pb.CudaSharedMemoryUnregisterRequest(name="a"))
        assert dataplane.forgotten == [[CudaHandle(raw_a, 0, 4096)]]
        await stub.CudaSharedMemoryUnregister(pb.CudaSharedMemoryUnregisterRequest())
        status = await stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest())
        assert len(status.regions) == 0
        assert dataplane.forgotten[1:] == [[CudaHandle(raw_b, 0, 8)]]

    serve(dataplane, test, allow_client_shm=True)


@pytest.mark.parametrize("request_fields,needle", [
    ({"raw_handle": b"\x01" * 63}, "'raw_handle'"), ({"raw_handle": b""}, "'raw_handle'"),
    ({"device_id": -1}, "'device_id'"), ({"device_id": 1}, "'device_id'"),
    ({"byte_size": 0}, "'byte_size'"), ({"name": ""}, "region name"),
])
def test_register_errors_name_the_field(fake_ipc: None, request_fields: dict[str, Any],
                                        needle: str) -> None:
    dataplane = make_dataplane()
    fields: dict[str, Any] = {"name": "g", "raw_handle": b"\x01" * 64, "device_id": 0,
                              "byte_size": 64} | request_fields

    async def test(stub: Any, channel: Any) -> None:
        error = await rpc_error(stub.CudaSharedMemoryRegister(register_request(**fields)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in error.details()
        status = await stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest())
        assert len(status.regions) == 0

    serve(dataplane, test, allow_client_shm=True)


def test_one_name_space_with_system_regions(fake_ipc: None) -> None:
    dataplane = make_dataplane()

    async def test(stub: Any, channel: Any) -> None:
        await stub.CudaSharedMemoryRegister(register_request("gpu", b"\x01" * 64))
        error = await rpc_error(stub.SystemSharedMemoryRegister(
            pb.SystemSharedMemoryRegisterRequest(name="gpu", key="/k", byte_size=8)))
        assert error.code() == grpc.StatusCode.ALREADY_EXISTS
        error = await rpc_error(stub.SystemSharedMemoryStatus(
            pb.SystemSharedMemoryStatusRequest(name="gpu")))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert "registered as CUDA shared memory" in error.details()
        await stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest())
        status = await stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest())
        assert list(status.regions) == ["gpu"]  # the system unregister left it
        assert dataplane.forgotten == []

    serve(dataplane, test, allow_client_shm=True)


def test_without_a_device_register_is_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROVIDER_ENV, raising=False)
    monkeypatch.setattr(cuda_shm, "cuda_device_count", lambda: 0)

    async def test(stub: Any, channel: Any) -> None:
        error = await rpc_error(stub.CudaSharedMemoryRegister(register_request("g", b"1" * 64)))
        assert (error.code(), error.details()) == (grpc.StatusCode.UNIMPLEMENTED,
                                                   CUDA_SHM_NO_DEVICE)
        await stub.CudaSharedMemoryUnregister(pb.CudaSharedMemoryUnregisterRequest(name="g"))

    serve(make_dataplane(), test, allow_client_shm=True)


def test_disabled_server_refuses_register_and_unregister(fake_ipc: None) -> None:
    async def test(stub: Any, channel: Any) -> None:
        status = await stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest())
        assert len(status.regions) == 0
        for call in (stub.CudaSharedMemoryRegister(register_request("g", b"\x01" * 64)),
                     stub.CudaSharedMemoryUnregister(pb.CudaSharedMemoryUnregisterRequest())):
            error = await rpc_error(call)
            assert (error.code(), error.details()) == (grpc.StatusCode.UNIMPLEMENTED,
                                                       DISABLED_MESSAGE)

    serve(make_dataplane(allow_client_shm=False), test)
