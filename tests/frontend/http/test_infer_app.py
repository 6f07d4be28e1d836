"""POST .../infer through the app: JSON and binary round trips (tritonclient's own encoder and
decoder), raw binary requests, compression, errors, and slot / lease ownership."""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton_http
from starlette.testclient import TestClient

from shoal.errors import unavailable
from shoal.frontend.http.app import create_app
from shoal.messages import TensorSpec
from shoal.settings import settings_from_flags
from tests.frontend.http.fakes import FakeDataPlane, make_model

LIMIT = 1 << 20
SETTINGS = settings_from_flags(model_repositories=["/models"],
                               http_max_input_size=LIMIT).for_frontends()
EVERY_TYPE = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
              "FP16", "FP32", "FP64", "BYTES"]


@pytest.fixture
def dataplane() -> FakeDataPlane:
    return FakeDataPlane(models=[
        make_model("identity", [TensorSpec("INPUT0", "FP32", [-1])]),
        make_model("batched", [TensorSpec("INPUT0", "INT32", [4])], max_batch_size=8),
        make_model("all_types", [TensorSpec(f"IN_{t}", t, [-1]) for t in EVERY_TYPE]),
        make_model("text", [TensorSpec("INPUT0", "BYTES", [1])]),
        make_model("decoupled", decoupled=True),
    ])


@pytest.fixture
def client(dataplane: FakeDataPlane) -> Iterator[TestClient]:
    with TestClient(create_app(dataplane, SETTINGS), raise_server_exceptions=False) as c:
        yield c


def post(client: TestClient, model: str, body: bytes, headers: dict[str, str] | None = None,
         *, accept: str = "identity") -> Any:
    return client.post(f"/v2/models/{model}/infer", content=body,
                       headers={"Accept-Encoding": accept, **(headers or {})})


def assert_clean(dataplane: FakeDataPlane) -> None:
    """Every input slot freed, every lease of an answered request released."""
    assert dataplane.live_slots == {}
    leases = [lease.lease_id for lease in dataplane.released if lease is not None]
    assert sorted(leases) == sorted(r.request_id for r in dataplane.requests)


def sample(datatype: str) -> np.ndarray[Any, Any]:
    if datatype == "BYTES":
        return np.array([b"a", b"", "ü".encode()], dtype=np.object_)
    if datatype == "BOOL":
        return np.array([True, False, True])
    return np.arange(3).astype(triton_http.triton_to_np_dtype(datatype))


# ---------------------------------------------------------------- round trips


def test_json_round_trip(client: TestClient, dataplane: FakeDataPlane) -> None:
    body = json.dumps({"id": "r1", "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [3], "data": [1.0, 2.5, -3.0]}]})
    response = post(client, "identity", body.encode())
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"id": "r1", "model_name": "identity", "model_version": "1",
                               "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [3],
                                            "data": [1.0, 2.5, -3.0]}]}
    assert_clean(dataplane)


@pytest.mark.parametrize("binary", [True, False])
def test_every_datatype_round_trips_through_tritonclient(client: TestClient,
                                                         dataplane: FakeDataPlane,
                                                         binary: bool) -> None:
    inputs: list[triton_http.InferInput] = []
    outputs: list[triton_http.InferRequestedOutput] = []
    for datatype in EVERY_TYPE:
        tensor = triton_http.InferInput(f"IN_{datatype}", [3], datatype)
        as_binary = binary or datatype == "FP16"
        tensor.set_data_from_numpy(sample(datatype), binary_data=as_binary)
        inputs.append(tensor)
        outputs.append(triton_http.InferRequestedOutput(
            f"OUTPUT{len(outputs)}", binary_data=as_binary))
    body, header_length = triton_http.InferenceServerClient.generate_request_body(
        inputs, outputs, request_id="rt")
    headers = {} if header_length is None else {
        "Inference-Header-Content-Length": str(header_length)}
    response = post(client, "all_types", body, headers)
    assert response.status_code == 200, response.text
    length = response.headers.get("inference-header-content-length")
    result = triton_http.InferenceServerClient.parse_response_body(
        response.content, header_length=None if length is None else int(length))
    assert result.get_response()["id"] == "rt"
    for index, datatype in enumerate(EVERY_TYPE):
        got = result.as_numpy(f"OUTPUT{index}")
        assert got is not None and got.shape == (3,), datatype
        expected = sample(datatype)
        if datatype == "BYTES" and not binary:  # JSON strings come back as str, as from Triton
            expected = np.array([item.decode() for item in expected], dtype=np.object_)
        assert np.array_equal(got, expected), datatype
    assert_clean(dataplane)


def test_binary_request_reaches_the_dataplane_as_refs(client: TestClient,
                                                      dataplane: FakeDataPlane) -> None:
    tensor = triton_http.InferInput("INPUT0", [2, 4], "INT32")
    tensor.set_data_from_numpy(np.arange(8, dtype=np.int32).reshape(2, 4))
    body, length = triton_http.InferenceServerClient.generate_request_body(
        [tensor], [triton_http.InferRequestedOutput("OUTPUT0")], sequence_id=9,
        sequence_start=True, priority=1, timeout=500, parameters={"custom": "x"})
    response = post(client, "batched", body, {"Inference-Header-Content-Length": str(length)})
    assert response.status_code == 200
    request = dataplane.requests[-1]
    assert (request.model, request.version, request.batch_size) == ("batched", 1, 2)
    assert (request.priority, request.timeout_us, request.correlation_id, request.flags) == \
        (1, 500, 9, 1)
    assert request.parameters == {"custom": "x"}
    assert [o.name for o in request.outputs] == ["OUTPUT0"]
    ref = request.inputs[0]
    assert (ref.name, ref.datatype, ref.shape, ref.nbytes) == ("INPUT0", "INT32", [2, 4], 32)


def test_raw_binary_request(client: TestClient, dataplane: FakeDataPlane) -> None:
    payload = np.arange(8, dtype=np.float32).tobytes()
    response = post(client, "identity", payload, {"Inference-Header-Content-Length": "0"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    length = int(response.headers["inference-header-content-length"])
    assert response.content[length:] == payload
    assert json.loads(response.content[:length])["outputs"][0]["shape"] == [8]
    assert_clean(dataplane)


def test_raw_bytes_request(client: TestClient) -> None:
    response = post(client, "text", b"427", {"Inference-Header-Content-Length": "0"})
    length = int(response.headers["inference-header-content-length"])
    assert response.content[length + 4:] == b"427"


def test_raw_request_for_multi_input_model_is_400(client: TestClient) -> None:
    response = post(client, "all_types", b"\0" * 8, {"Inference-Header-Content-Length": "0"})
    assert response.status_code == 400
    assert "Raw request must only have 1 input" in response.json()["error"]


# ---------------------------------------------------------------- compression


def _json_body() -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2],
                                   "data": [1, 2]}]}).encode()


@pytest.mark.parametrize("encoding,compress", [("gzip", gzip.compress),
                                               ("deflate", zlib.compress)])
def test_compressed_request_body(client: TestClient, encoding: str, compress: Any) -> None:
    response = post(client, "identity", compress(_json_body()), {"Content-Encoding": encoding})
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"] == [1.0, 2.0]


def test_unknown_content_encoding_is_501_with_accept_encoding(client: TestClient) -> None:
    response = post(client, "identity", _json_body(), {"Content-Encoding": "br"})
    assert response.status_code == 501
    assert response.json() == {"error": "Unsupported compression type"}
    assert response.headers["accept-encoding"] == "gzip, deflate"


def test_compressed_response_when_asked(client: TestClient) -> None:
    response = client.post("/v2/models/identity/infer", content=_json_body(),
                           headers={"Accept-Encoding": "gzip"})
    assert response.status_code == 200
    assert response.headers["content-encoding"] == "gzip"
    assert response.json()["outputs"][0]["data"] == [1.0, 2.0]  # httpx inflated it


def test_decompression_bomb_is_refused(client: TestClient, dataplane: FakeDataPlane) -> None:
    bomb = gzip.compress(b" " * (LIMIT * 4))
    response = post(client, "identity", bomb, {"Content-Encoding": "gzip"})
    assert response.status_code == 400
    assert "exceeds the maximum allowed value" in response.json()["error"]
    assert dataplane.requests == [] and client.get("/v2/health/live").status_code == 200


# ---------------------------------------------------------------- errors


def test_body_over_the_limit_is_refused(client: TestClient, dataplane: FakeDataPlane) -> None:
    response = post(client, "identity", b"\0" * (LIMIT + 1),
                    {"Inference-Header-Content-Length": "0"})
    assert response.status_code == 400
    assert "exceeds the maximum allowed value" in response.json()["error"]
    assert dataplane.allocations == 0


def test_decoupled_model_is_refused_on_infer(client: TestClient) -> None:
    response = post(client, "decoupled", _json_body())
    assert response.status_code == 501
    assert response.json() == {
        "error": "HTTP end point doesn't support models with decoupled transaction policy"}


def test_unknown_model_on_infer(client: TestClient) -> None:
    response = post(client, "nope", _json_body())
    assert response.status_code == 404
    assert response.json() == {"error": "Request for unknown model: 'nope' is not found"}


def test_header_length_out_of_range(client: TestClient) -> None:
    for value in ("99999999999", "-3"):
        response = post(client, "identity", _json_body(),
                        {"Inference-Header-Content-Length": value})
        assert response.status_code == 400
        assert "inference header size should be in range" in response.json()["error"]


def test_validation_error_allocates_nothing(client: TestClient, dataplane: FakeDataPlane) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [9, 4],
                                   "data": [0] * 36}]}).encode()
    response = post(client, "batched", body)
    assert response.status_code == 400
    assert response.json() == {"error": "[request id: <id_unknown>] inference request batch-size "
                                        "must be <= 8 for 'batched'"}
    assert dataplane.allocations == 0 and dataplane.requests == []


def test_failed_allocation_frees_the_slots_already_taken(client: TestClient,
                                                         dataplane: FakeDataPlane) -> None:
    allocate = dataplane.allocate

    def second_fails(nbytes: int) -> Any:
        if dataplane.allocations >= 1:
            raise unavailable("shared-memory arena is full")
        return allocate(nbytes)

    dataplane.allocate = second_fails  # type: ignore[method-assign]
    inputs = []
    for datatype in EVERY_TYPE:
        tensor = triton_http.InferInput(f"IN_{datatype}", [3], datatype)
        tensor.set_data_from_numpy(sample(datatype))
        inputs.append(tensor)
    body, length = triton_http.InferenceServerClient.generate_request_body(inputs)
    response = post(client, "all_types", body, {"Inference-Header-Content-Length": str(length)})
    assert response.status_code == 503
    assert dataplane.allocations == 1 and dataplane.live_slots == {}


def test_error_answer_from_the_broker(client: TestClient, dataplane: FakeDataPlane) -> None:
    dataplane.infer_error = unavailable("Request timeout expired")
    response = post(client, "identity", _json_body())
    assert response.status_code == 503
    assert response.json() == {"error": "Request timeout expired"}
    assert dataplane.live_slots == {} and dataplane.released == []


def test_lease_is_released_when_encoding_fails(client: TestClient,
                                               dataplane: FakeDataPlane) -> None:
    def broken_view(ref: Any) -> memoryview:
        raise RuntimeError("worker segment vanished")

    dataplane.output_view = broken_view  # type: ignore[method-assign]
    response = post(client, "identity", _json_body())
    assert response.status_code == 500 and response.json() == {"error": "internal error"}
    assert_clean(dataplane)


def test_classification_through_the_app(client: TestClient) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4],
                                   "data": [0.1, 0.9, 0.5, 0.7]}],
                       "outputs": [{"name": "OUTPUT0",
                                    "parameters": {"classification": 2}}]}).encode()
    response = post(client, "identity", body)
    assert response.json()["outputs"] == [
        {"name": "OUTPUT0", "datatype": "BYTES", "shape": [2],
         "data": ["0.900000:1", "0.700000:3"]}]


def test_response_parameters_are_returned(client: TestClient, dataplane: FakeDataPlane) -> None:
    dataplane.response_parameters = {"note": "hi", "n": 2}
    assert post(client, "identity", _json_body()).json()["parameters"] == {"note": "hi", "n": 2}


def test_versioned_infer_route(client: TestClient) -> None:
    assert post(client, "identity/versions/1", _json_body()).status_code == 200
    response = post(client, "identity/versions/2", _json_body())
    assert response.status_code == 404


def test_bytes_framing_error_names_the_input(client: TestClient) -> None:
    payload = struct.pack("<I", 10) + b"abc"
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1],
                                     "parameters": {"binary_data_size": len(payload)}}]}).encode()
    response = post(client, "text", header + payload,
                    {"Inference-Header-Content-Length": str(len(header))})
    assert response.status_code == 400
    assert "incomplete string data for inference input 'INPUT0'" in response.json()["error"]


@pytest.mark.parametrize("depth,status", [(50, 200), (120, 400)])
def test_json_nesting_depth_limit_on_infer(client: TestClient, depth: int, status: int) -> None:
    data: Any = 1.5
    for _ in range(depth):
        data = [data]
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1],
                                   "data": data}]}).encode()
    response = post(client, "identity", body)
    assert response.status_code == status
    if status == 400:
        assert "JSON nesting depth exceeds maximum allowed limit (100)" in \
            response.json()["error"]
    else:
        assert response.json()["outputs"][0]["data"] == [1.5]
