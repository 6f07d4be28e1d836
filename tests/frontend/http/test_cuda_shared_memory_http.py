"""The CUDA shared-memory extension over HTTP, without server processes or a GPU: the three
routes (with the test stand-in for CUDA IPC, ``tests.fakes.cuda_ipc`` plugged in by
``SHOAL_CUDA_IPC_PROVIDER``, the server has one device; a patched device probe stands in for
torch), body checks, the name space shared with system regions, and infer requests whose tensors
are in a CUDA region (the DataPlane gets references carrying the registration; the region is
forgotten after the request ends)."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.testclient import TestClient

from shoal.frontend import cuda_shm
from shoal.frontend.core.dataplane import InferOutcome
from shoal.frontend.http.app import create_app
from shoal.frontend.shm_registry import ClientSharedMemoryRegistry
from shoal.messages import CudaHandle, InferRequest, InferResponse, TensorRef
from shoal.settings import FrontendSettings, settings_from_flags
from shoal.shm.arena import Slot
from shoal.shm.cuda_ipc import PROVIDER_ENV
from tests.fakes.cuda_ipc import PROVIDER
from tests.frontend.http.fakes import FakeDataPlane, make_model

ENABLED = settings_from_flags(model_repositories=["/m"], allow_client_shm=True).for_frontends()
DISABLED = settings_from_flags(model_repositories=["/m"]).for_frontends()
NO_DEVICE = "CUDA shared memory is not supported: torch sees no CUDA device"


@dataclass
class CudaFakeDataPlane(FakeDataPlane):
    """Records requests (their inputs live in client memory, nothing is read) and answers each
    output at its target, as a worker would; ends each request in the registry."""

    forgotten: list[list[CudaHandle]] = field(default_factory=list)
    shared_memory: ClientSharedMemoryRegistry = field(init=False)
    settings: FrontendSettings = ENABLED

    def __post_init__(self) -> None:
        self.shared_memory = ClientSharedMemoryRegistry(self.settings,
                                                        on_cuda_forget=self.forgotten.append)

    async def infer(self, request: InferRequest, slots: list[Slot]) -> InferOutcome:
        self.requests.append(request)
        for slot in slots:
            self.free(slot)
        self.shared_memory.release_request(request.request_id)
        info = self.model(request.model, str(request.version))
        outputs = [TensorRef(o.name, "FP32", [4], "", 0, 16) for o in request.outputs]
        return InferOutcome(InferResponse(request.request_id, info.version, outputs), info)


@pytest.fixture
def dataplane() -> Iterator[CudaFakeDataPlane]:
    plane = CudaFakeDataPlane(models=[make_model("identity")])
    yield plane
    plane.shared_memory.close()


@pytest.fixture
def fake_ipc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROVIDER_ENV, PROVIDER)


def app_client(dataplane: CudaFakeDataPlane, settings: FrontendSettings = ENABLED) -> TestClient:
    return TestClient(create_app(dataplane, settings), raise_server_exceptions=False)


def body(raw: bytes, device_id: int = 0, byte_size: int = 64) -> dict[str, Any]:
    return {"raw_handle": {"b64": base64.b64encode(raw).decode()}, "device_id": device_id,
            "byte_size": byte_size}


def register(client: TestClient, name: str, document: dict[str, Any]) -> Any:
    return client.post(f"/v2/cudasharedmemory/region/{name}/register", json=document)


def test_register_status_unregister_routes(dataplane: CudaFakeDataPlane, fake_ipc: None) -> None:
    raw_a, raw_b = secrets.token_bytes(64), secrets.token_bytes(64)
    with app_client(dataplane) as client:
        assert register(client, "b", body(raw_b, byte_size=8)).status_code == 200
        assert register(client, "a", body(raw_a, byte_size=4096)).status_code == 200
        assert client.get("/v2/cudasharedmemory/status").json() == [
            {"name": "a", "device_id": 0, "byte_size": 4096},
            {"name": "b", "device_id": 0, "byte_size": 8}]
        assert client.get("/v2/cudasharedmemory/region/b/status").json() == [
            {"name": "b", "device_id": 0, "byte_size": 8}]
        missing = client.get("/v2/cudasharedmemory/region/x/status")
        assert missing.status_code == 404
        assert missing.json()["error"] == "Unable to find cuda shared memory region: 'x'"
        again = register(client, "a", body(raw_a))
        assert again.status_code == 400 and "already" in again.json()["error"]
        assert client.post("/v2/cudasharedmemory/region/a/unregister").status_code == 200
        assert dataplane.forgotten == [[CudaHandle(raw_a, 0, 4096)]]
        assert [r["name"] for r in client.get("/v2/cudasharedmemory/status").json()] == ["b"]
        assert client.post("/v2/cudasharedmemory/unregister").status_code == 200
        assert client.get("/v2/cudasharedmemory/status").json() == []
        assert dataplane.forgotten[1:] == [[CudaHandle(raw_b, 0, 8)]]


@pytest.mark.parametrize("document,needle", [
    ({"device_id": 0, "byte_size": 8}, "no 'raw_handle' field"),
    ({"raw_handle": "AAAA", "device_id": 0, "byte_size": 8}, "'raw_handle'"),
    ({"raw_handle": {"b64": 5}, "device_id": 0, "byte_size": 8}, "'raw_handle'"),
    ({"raw_handle": {"b64": "!!not base64!!"}, "device_id": 0, "byte_size": 8}, "'raw_handle'"),
    ({"raw_handle": {"b64": "AAA"}, "device_id": 0, "byte_size": 8}, "'raw_handle'"),  # padding
    (body(b"\x01" * 63), "'raw_handle'"), (body(b"\x01" * 65), "'raw_handle'"),
    (body(b"\x01" * 64, device_id=-1), "'device_id'"),
    (body(b"\x01" * 64, device_id=1), "'device_id'"),  # the fake has one device
    ({**body(b"\x01" * 64), "device_id": "0"}, "'device_id'"),
    ({"raw_handle": {"b64": "AA=="}, "byte_size": 8}, "no 'device_id' field"),
    (body(b"\x01" * 64, byte_size=0), "'byte_size'"),
    (body(b"\x01" * 64, byte_size=-8), "'byte_size'"),
    ({"raw_handle": {"b64": "AA=="}, "device_id": 0}, "no 'byte_size' field"),
])
def test_register_body_errors_name_the_field(dataplane: CudaFakeDataPlane, fake_ipc: None,
                                             document: dict[str, Any], needle: str) -> None:
    with app_client(dataplane) as client:
        reply = register(client, "g", document)
        assert reply.status_code == 400 and needle in reply.json()["error"], reply.text
        assert client.get("/v2/cudasharedmemory/status").json() == []


def test_region_name_is_required(dataplane: CudaFakeDataPlane) -> None:
    with app_client(dataplane) as client:  # no device either: the name is checked first
        reply = client.post("/v2/cudasharedmemory/register", json=body(b"\x01" * 64))
        assert reply.status_code == 400 and "region name" in reply.json()["error"]


def test_without_a_device_register_is_unsupported(dataplane: CudaFakeDataPlane,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROVIDER_ENV, raising=False)
    monkeypatch.setattr(cuda_shm, "cuda_device_count", lambda: 0)
    with app_client(dataplane) as client:
        reply = register(client, "g", body(b"\x01" * 64))
        assert (reply.status_code, reply.json()["error"]) == (501, NO_DEVICE)
        assert client.get("/v2/cudasharedmemory/status").json() == []
        assert client.post("/v2/cudasharedmemory/region/g/unregister").status_code == 200


def test_this_machine_without_a_gpu_is_unsupported(dataplane: CudaFakeDataPlane,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROVIDER_ENV, raising=False)
    if cuda_shm.cuda_device_count():
        pytest.skip("this machine has a CUDA device")
    with app_client(dataplane) as client:
        reply = register(client, "g", body(b"\x01" * 64))
        assert (reply.status_code, reply.json()["error"]) == (501, NO_DEVICE)


def test_device_ids_follow_torchs_device_count(dataplane: CudaFakeDataPlane,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROVIDER_ENV, raising=False)
    monkeypatch.setattr(cuda_shm, "cuda_device_count", lambda: 2)
    with app_client(dataplane) as client:
        assert register(client, "g", body(b"\x01" * 64, device_id=1)).status_code == 200
        reply = register(client, "h", body(b"\x01" * 64, device_id=2))
        assert reply.status_code == 400 and "'device_id' 2" in reply.json()["error"]


def test_disabled_server_refuses_register_and_unregister(fake_ipc: None) -> None:
    plane = CudaFakeDataPlane(models=[make_model("identity")], settings=DISABLED)
    with app_client(plane, DISABLED) as client:
        for path in ("/v2/cudasharedmemory/region/g/register",
                     "/v2/cudasharedmemory/region/g/unregister", "/v2/cudasharedmemory/unregister"):
            reply = client.post(path, json=body(b"\x01" * 64))
            assert reply.status_code == 501 and "--allow-client-shm" in reply.json()["error"]
        assert client.get("/v2/cudasharedmemory/status").json() == []


def test_one_name_space_kind_aware_status_and_unregister(
        dataplane: CudaFakeDataPlane, fake_ipc: None,
        make_object: Callable[[int], str]) -> None:
    key = make_object(64)
    with app_client(dataplane) as client:
        assert client.post("/v2/systemsharedmemory/region/sys/register",
                           json={"key": key, "byte_size": 64}).status_code == 200
        assert register(client, "gpu", body(b"\x01" * 64)).status_code == 200
        clash = register(client, "sys", body(b"\x02" * 64))
        assert clash.status_code == 400 and "already" in clash.json()["error"]
        clash = client.post("/v2/systemsharedmemory/region/gpu/register",
                            json={"key": key, "byte_size": 64})
        assert clash.status_code == 400 and "already" in clash.json()["error"]
        reply = client.get("/v2/cudasharedmemory/region/sys/status")
        assert reply.status_code == 404 and "system shared memory" in reply.json()["error"]
        reply = client.get("/v2/systemsharedmemory/region/gpu/status")
        assert reply.status_code == 404 and "CUDA shared memory" in reply.json()["error"]
        assert client.get("/v2/systemsharedmemory/status").json() == [
            {"name": "sys", "key": key, "offset": 0, "byte_size": 64}]
        # unregister of the other kind does nothing
        assert client.post("/v2/systemsharedmemory/region/gpu/unregister").status_code == 200
        assert client.post("/v2/cudasharedmemory/region/sys/unregister").status_code == 200
        assert client.post("/v2/systemsharedmemory/unregister").status_code == 200
        assert [r["name"] for r in client.get("/v2/cudasharedmemory/status").json()] == ["gpu"]
        assert client.post("/v2/cudasharedmemory/unregister").status_code == 200
        assert client.get("/v2/cudasharedmemory/status").json() == []


def test_infer_with_tensors_in_a_cuda_region(dataplane: CudaFakeDataPlane,
                                             fake_ipc: None) -> None:
    raw = secrets.token_bytes(64)
    cuda = CudaHandle(raw, 0, 1024)
    inputs = [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "parameters": {
        "shared_memory_region": "g", "shared_memory_offset": 64,
        "shared_memory_byte_size": 16}}]
    outputs = [{"name": "OUTPUT0", "parameters": {
        "shared_memory_region": "g", "shared_memory_offset": 512,
        "shared_memory_byte_size": 16}}]
    with app_client(dataplane) as client:
        assert register(client, "g", body(raw, byte_size=1024)).status_code == 200
        reply = client.post("/v2/models/identity/infer",
                            json={"inputs": inputs, "outputs": outputs})
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32",
                                            "shape": [4]}]
        request = dataplane.requests[-1]
        assert request.inputs == [TensorRef("INPUT0", "FP32", [4], "", 64, 16, cuda=cuda)]
        target = request.outputs[0].target
        assert target is not None and (target.region, target.offset, target.cuda) == (
            "", 512, cuda)
        assert dataplane.allocations == 0  # referenced in place
        past_end = {**inputs[0], "parameters": {**inputs[0]["parameters"],
                                                "shared_memory_offset": 1020}}
        reply = client.post("/v2/models/identity/infer", json={"inputs": [past_end]})
        assert reply.status_code == 400 and "'g'" in reply.json()["error"]
        assert client.post("/v2/cudasharedmemory/region/g/unregister").status_code == 200
    assert dataplane.forgotten == [[cuda]]
    assert len(dataplane.requests) == 1  # the refused one never reached the DataPlane
