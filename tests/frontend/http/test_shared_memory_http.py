"""The system shared-memory extension over HTTP, without server processes: the ``shared_memory_*``
tensor parameters (decoding, validation), the register/status/unregister routes, and infer with
inputs and outputs in real POSIX shm objects (``/shmtest-<random>``) through an in-test
DataPlane that reads and writes the client's objects as a worker would. CUDA regions:
``test_cuda_shared_memory_http.py``."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from shoal.dtypes import numpy_dtype
from shoal.errors import ErrorCode, ShoalError, invalid_arg
from shoal.frontend.core.dataplane import InferOutcome
from shoal.frontend.core.shm_params import SharedMemorySlice
from shoal.frontend.core.validation import validate_request
from shoal.frontend.http.app import create_app
from shoal.frontend.http.codec import decode_infer_request
from shoal.frontend.shm_registry import ClientSharedMemoryRegistry
from shoal.messages import InferRequest, InferResponse, Lease, TensorRef, TensorSpec
from shoal.settings import FrontendSettings, settings_from_flags
from shoal.shm.arena import Slot
from tests.frontend.http.fakes import FakeDataPlane, make_model

ENABLED = settings_from_flags(model_repositories=["/m"], allow_client_shm=True).for_frontends()
DISABLED = settings_from_flags(model_repositories=["/m"]).for_frontends()
MODEL = make_model("m", [TensorSpec("INPUT0", "FP32", [-1], optional=True),
                         TensorSpec("INPUT1", "BYTES", [-1], optional=True),
                         TensorSpec("INPUT2", "FP16", [-1], optional=True)])
JSON_OUTPUT0 = [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]


def error_of(call: Callable[[], object]) -> ShoalError:
    with pytest.raises(ShoalError) as info:
        call()
    return info.value


def decode(document: dict[str, Any]) -> Any:
    return decode_infer_request(json.dumps(document).encode(), None, MODEL, 1 << 20)


def shm_input(name: str = "INPUT0", datatype: str = "FP32", shape: list[int] | None = None,
              **params: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape or [4], "parameters": params}


# ---------------------------------------------------------------- decoding and validation


def test_shm_parameters_are_decoded_for_inputs_and_outputs() -> None:
    request = decode({
        "inputs": [shm_input(shared_memory_region="in", shared_memory_byte_size=16,
                             shared_memory_offset=64)],
        "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "out",
                                                       "shared_memory_byte_size": 32,
                                                       "binary_data": False}}],
    })
    tensor = request.inputs[0]
    assert tensor.shm == SharedMemorySlice("in", 64, 16) and len(tensor.data) == 0
    output = request.outputs[0]
    assert output.shm == SharedMemorySlice("out", 0, 32)  # offset defaults to 0
    assert "shared_memory_region" not in output.parameters  # not passed to the model


@pytest.mark.parametrize("params", [
    {"shared_memory_region": "r"},
    {"shared_memory_byte_size": 16},
    {"shared_memory_offset": 0, "shared_memory_byte_size": 16},
])
def test_region_and_byte_size_come_together(params: dict[str, Any]) -> None:
    error = error_of(lambda: decode({"inputs": [shm_input(**params)]}))
    assert error.code is ErrorCode.INVALID_ARG and "input 'INPUT0'" in error.message
    error = error_of(lambda: decode({"inputs": [], "outputs": [
        {"name": "OUTPUT0", "parameters": params}]}))
    assert error.code is ErrorCode.INVALID_ARG and "output 'OUTPUT0'" in error.message


def test_data_and_shared_memory_exclude_each_other() -> None:
    item = shm_input(shared_memory_region="r", shared_memory_byte_size=16)
    error = error_of(lambda: decode({"inputs": [{**item, "data": [1, 2, 3, 4]}]}))
    assert error.message.startswith("Input must set only one of the following fields")
    assert "But set 'data' 'shared_memory_region'" in error.message  # Triton's text
    item["parameters"]["binary_data_size"] = 16
    error = error_of(lambda: decode({"inputs": [item]}))
    assert "But set 'binary_data_size' 'shared_memory_region'" in error.message


@pytest.mark.parametrize("params,needle", [
    ({"shared_memory_region": 5, "shared_memory_byte_size": 16}, "'shared_memory_region'"),
    ({"shared_memory_region": "r", "shared_memory_byte_size": -1}, "'shared_memory_byte_size'"),
    ({"shared_memory_region": "r", "shared_memory_byte_size": 2**64},
     "'shared_memory_byte_size'"),
    ({"shared_memory_region": "r", "shared_memory_byte_size": 1.5}, "'shared_memory_byte_size'"),
    ({"shared_memory_region": "r", "shared_memory_byte_size": 4, "shared_memory_offset": "0"},
     "'shared_memory_offset'"),
])
def test_malformed_shm_parameters_name_the_field(params: dict[str, Any], needle: str) -> None:
    error = error_of(lambda: decode({"inputs": [shm_input(**params)]}))
    assert needle in error.message and "'INPUT0'" in error.message


@pytest.mark.parametrize("extra,needle", [
    ({"classification": 2}, "'classification'"), ({"binary_data": True}, "'binary_data'")])
def test_shm_outputs_cannot_be_classified_or_binary(extra: dict[str, Any], needle: str) -> None:
    params = {"shared_memory_region": "r", "shared_memory_byte_size": 4, **extra}
    error = error_of(lambda: decode({"inputs": [], "outputs": [
        {"name": "OUTPUT0", "parameters": params}]}))
    assert needle in error.message and "'OUTPUT0'" in error.message


def test_validation_uses_the_shm_byte_size() -> None:
    request = decode({"inputs": [shm_input(shared_memory_region="r", shared_memory_byte_size=12)],
                      "outputs": JSON_OUTPUT0})
    error = error_of(lambda: validate_request(request, MODEL))
    assert "input byte size mismatch for input 'INPUT0'" in error.message
    assert "Expected 16, got 12" in error.message
    good = decode({"inputs": [shm_input(shared_memory_region="r", shared_memory_byte_size=16),
                              shm_input("INPUT1", "BYTES", [2], shared_memory_region="r",
                                        shared_memory_byte_size=3)],
                   "outputs": JSON_OUTPUT0})
    validate_request(good, MODEL)  # BYTES framing is the registry's check, at resolve time


def test_fp16_outputs_may_go_to_shared_memory() -> None:
    request = decode({"inputs": [], "outputs": [{"name": "OUTPUT2", "parameters": {
        "shared_memory_region": "r", "shared_memory_byte_size": 8}}]})
    plan = validate_request(request, MODEL)
    assert plan.outputs[0].shm == SharedMemorySlice("r", 0, 8)


# ---------------------------------------------------------------- through the app


@dataclass
class ShmFakeDataPlane(FakeDataPlane):
    """FakeDataPlane whose infer also reads inputs from, and writes outputs into, client
    objects (as a worker does) and releases the request's regions at the end (as the real
    DataPlane does)."""

    shared_memory: ClientSharedMemoryRegistry = field(
        default_factory=lambda: ClientSharedMemoryRegistry(ENABLED))
    ended: list[int] = field(default_factory=list)

    async def infer(self, request: InferRequest, slots: list[Slot]) -> InferOutcome:
        try:
            return self._echo(request)
        finally:
            for slot in slots:
                self.free(slot)
            self.shared_memory.release_request(request.request_id)
            self.ended.append(request.request_id)

    def _echo(self, request: InferRequest) -> InferOutcome:
        self.requests.append(request)
        info = self.model(request.model, str(request.version))
        targets = {o.name: o.target for o in request.outputs}
        outputs: list[TensorRef] = []
        for spec_in, spec_out in zip(info.inputs, info.outputs, strict=True):
            ref = next((r for r in request.inputs if r.name == spec_in.name), None)
            if ref is None or (targets and spec_out.name not in targets):
                continue
            content = (bytes(self.live_slots[(ref.region, ref.offset)])
                       if ref.region == "/fake-in" else read_object(ref.region, ref.offset,
                                                                    ref.nbytes))
            target = targets.get(spec_out.name)
            if target is None:
                key = ("/fake-out", len(self._outputs))
                self._outputs[key] = content
                outputs.append(TensorRef(spec_out.name, ref.datatype, ref.shape, key[0], key[1],
                                         len(content)))
                continue
            if len(content) > target.nbytes:
                raise invalid_arg(f"output '{spec_out.name}' does not fit")
            write_object(target.region, target.offset, content)
            outputs.append(TensorRef(spec_out.name, ref.datatype, ref.shape, target.region,
                                     target.offset, len(content)))
        response = InferResponse(request.request_id, info.version, outputs, {}, None,
                                 Lease("fake-worker", request.request_id))
        return InferOutcome(response, info)


def read_object(key: str, offset: int, nbytes: int) -> bytes:
    fd = os.open("/dev/shm" + key, os.O_RDONLY)
    try:
        return os.pread(fd, nbytes, offset)
    finally:
        os.close(fd)


def write_object(key: str, offset: int, data: bytes) -> None:
    fd = os.open("/dev/shm" + key, os.O_RDWR)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


ALL = ["BOOL", "UINT8", "INT16", "INT64", "FP16", "FP32", "FP64", "BYTES"]


@pytest.fixture
def dataplane() -> Iterator[ShmFakeDataPlane]:
    plane = ShmFakeDataPlane(models=[
        make_model("identity", [TensorSpec("INPUT0", "FP32", [-1])]),
        make_model("all", [TensorSpec(f"IN_{t}", t, [-1], optional=True) for t in ALL],
                   [TensorSpec(f"OUT_{t}", t, [-1]) for t in ALL]),
    ])
    yield plane
    plane.shared_memory.close()


def app_client(dataplane: ShmFakeDataPlane, settings: FrontendSettings = ENABLED) -> TestClient:
    return TestClient(create_app(dataplane, settings), raise_server_exceptions=False)


def register(client: TestClient, name: str, key: str, byte_size: int, offset: int = 0) -> Any:
    return client.post(f"/v2/systemsharedmemory/region/{name}/register",
                       json={"key": key, "offset": offset, "byte_size": byte_size})


def test_register_status_unregister_routes(dataplane: ShmFakeDataPlane,
                                           make_object: Callable[[int], str]) -> None:
    key = make_object(128)
    with app_client(dataplane) as client:
        assert register(client, "r", key, 64, 32).status_code == 200
        assert client.post("/v2/systemsharedmemory/region/s/register",
                           json={"key": key, "byte_size": 8}).status_code == 200
        assert client.get("/v2/systemsharedmemory/status").json() == [
            {"name": "r", "key": key, "offset": 32, "byte_size": 64},
            {"name": "s", "key": key, "offset": 0, "byte_size": 8}]
        assert client.get("/v2/systemsharedmemory/region/s/status").json() == [
            {"name": "s", "key": key, "offset": 0, "byte_size": 8}]
        missing = client.get("/v2/systemsharedmemory/region/x/status")
        assert missing.status_code == 404 and "'x'" in missing.json()["error"]
        again = register(client, "r", key, 64)
        assert again.status_code == 400 and "already" in again.json()["error"]
        assert client.post("/v2/systemsharedmemory/region/r/unregister").status_code == 200
        assert [r["name"] for r in client.get("/v2/systemsharedmemory/status").json()] == ["s"]
        assert client.post("/v2/systemsharedmemory/unregister").status_code == 200
        assert client.get("/v2/systemsharedmemory/status").json() == []


@pytest.mark.parametrize("body,needle", [
    ({"byte_size": 8}, "no 'key' field"), ({"key": "/k"}, "no 'byte_size' field"),
    ({"key": 3, "byte_size": 8}, "'key'"), ({"key": "/k", "byte_size": -8}, "'byte_size'"),
    ({"key": "/k", "byte_size": 8, "offset": "1"}, "'offset'"),
    ({"key": "/shoal-0123456789ab-fe1-0", "byte_size": 8}, "reserved"),
])
def test_register_body_errors(dataplane: ShmFakeDataPlane, body: dict[str, Any],
                              needle: str) -> None:
    with app_client(dataplane) as client:
        reply = client.post("/v2/systemsharedmemory/region/r/register", json=body)
        assert reply.status_code == 400 and needle in reply.json()["error"]
        assert "shoal-0123" not in reply.json()["error"]
        reply = client.post("/v2/systemsharedmemory/register", json={"key": "/k", "byte_size": 1})
        assert reply.status_code == 400 and "region name" in reply.json()["error"]


def test_wrong_methods_are_405(dataplane: ShmFakeDataPlane) -> None:
    with app_client(dataplane) as client:
        assert client.post("/v2/systemsharedmemory/status").status_code == 405
        assert client.get("/v2/systemsharedmemory/region/r/register").status_code == 405
        assert client.get("/v2/cudasharedmemory/unregister").status_code == 405


def test_disabled_server_answers_501_except_status(make_object: Callable[[int], str]) -> None:
    plane = ShmFakeDataPlane(models=[make_model("identity")],
                             shared_memory=ClientSharedMemoryRegistry(DISABLED))
    key = make_object(64)
    with app_client(plane, DISABLED) as client:
        for path in ("/v2/systemsharedmemory/region/r/register",
                     "/v2/systemsharedmemory/region/r/unregister",
                     "/v2/systemsharedmemory/unregister",
                     "/v2/cudasharedmemory/region/r/register", "/v2/cudasharedmemory/unregister"):
            reply = client.post(path, json={"key": key, "byte_size": 64})
            assert reply.status_code == 501, path
            assert "--allow-client-shm" in reply.json()["error"]
        assert client.get("/v2/systemsharedmemory/status").json() == []
        assert client.get("/v2/cudasharedmemory/status").json() == []
        body = {"inputs": [shm_input(shared_memory_region="r", shared_memory_byte_size=16)]}
        reply = client.post("/v2/models/identity/infer", json=body)
        assert reply.status_code == 501 and "--allow-client-shm" in reply.json()["error"]


def bytes_frame(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def test_infer_with_every_tensor_in_one_shared_region(dataplane: ShmFakeDataPlane,
                                                      make_object: Callable[[int], str]) -> None:
    """Inputs at offsets of one region, outputs at other offsets of it; the response carries
    name/datatype/shape only and the outputs are in the object."""
    key = make_object(1 << 16)
    arrays: dict[str, bytes] = {}
    rng = np.random.default_rng(3)
    for datatype in ALL:
        if datatype == "BYTES":
            arrays[datatype] = bytes_frame([b"a", b"", b"\xff\x00zz"])
        else:
            arrays[datatype] = (rng.random(3) * 100).astype(numpy_dtype(datatype)).tobytes()
    inputs, outputs = [], []
    offset = 0
    for datatype, data in arrays.items():
        write_object(key, 100 + offset, data)
        inputs.append(shm_input(f"IN_{datatype}", datatype, [3], shared_memory_region="r",
                                shared_memory_offset=offset, shared_memory_byte_size=len(data)))
        outputs.append({"name": f"OUT_{datatype}", "parameters": {
            "shared_memory_region": "r", "shared_memory_offset": 30000 + offset,
            "shared_memory_byte_size": 512}})
        offset += 1000
    with app_client(dataplane) as client:
        assert register(client, "r", key, 60000, 100).status_code == 200
        reply = client.post("/v2/models/all/infer", json={"inputs": inputs, "outputs": outputs})
        assert reply.status_code == 200, reply.text
        assert reply.headers["content-type"] == "application/json"
        document = reply.json()
        assert document["outputs"] == [{"name": f"OUT_{dt}", "datatype": dt, "shape": [3]}
                                       for dt in ALL]
    request = dataplane.requests[-1]
    assert all(ref.region == key for ref in request.inputs)  # referenced in place, no slot
    assert dataplane.allocations == 0
    assert [o.target.offset for o in request.outputs if o.target] == [
        100 + 30000 + 1000 * i for i in range(len(ALL))]
    for i, (datatype, data) in enumerate(arrays.items()):
        assert read_object(key, 100 + 30000 + 1000 * i, len(data)) == data, datatype
    assert dataplane.ended == [request.request_id]
    assert dataplane.shared_memory.status(None)[0].name == "r"


def test_mixed_request_shm_input_and_binary_output(dataplane: ShmFakeDataPlane,
                                                   make_object: Callable[[int], str]) -> None:
    key = make_object(64)
    values = np.arange(4, dtype=np.float32)
    write_object(key, 0, values.tobytes())
    body = {"inputs": [shm_input(shared_memory_region="r", shared_memory_byte_size=16)],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]}
    with app_client(dataplane) as client:
        register(client, "r", key, 64)
        reply = client.post("/v2/models/identity/infer", json=body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"][0]["data"] == values.tolist()


@pytest.mark.parametrize("change,status,needle", [
    ({"shared_memory_region": "nope"}, 404, "'nope'"),
    ({"shared_memory_offset": 60}, 400, "'r'"),
    ({"shared_memory_offset": 2**63 - 1}, 400, "'r'"),
    ({"shared_memory_byte_size": 2**63 - 1}, 400, "'r'"),
])
def test_bad_shm_references_release_what_was_resolved(
        dataplane: ShmFakeDataPlane, make_object: Callable[[int], str],
        change: dict[str, Any], status: int, needle: str) -> None:
    """The output is resolved after the input: a bad output leaves nothing marked in use."""
    key = make_object(64)
    good = {"shared_memory_region": "r", "shared_memory_byte_size": 16}
    for bad_side in ("input", "output"):
        inputs = [shm_input(**(good | change if bad_side == "input" else good))]
        outputs = [{"name": "OUTPUT0",
                    "parameters": good | change if bad_side == "output" else good}]
        with app_client(dataplane) as client:
            register(client, "r", key, 64)
            reply = client.post("/v2/models/identity/infer",
                                json={"inputs": inputs, "outputs": outputs})
            if bad_side == "input" and "shared_memory_byte_size" in change:
                assert reply.status_code == 400  # caught by validation (size vs shape)
            else:
                assert reply.status_code == status, reply.text
                assert needle in reply.json()["error"]
            # unregister closes the object at once: nothing holds it for a request
            client.post("/v2/systemsharedmemory/unregister")
        assert not dataplane.shared_memory._in_use and not dataplane.shared_memory._retiring
    assert dataplane.requests == []
