"""The gRPC endpoint of a real server, through tritonclient.grpc (and the generated stub where a
test needs the wire): every RPC, the same results and the same error texts as HTTP, typed
contents, streams (multiplexing, decoupled models, in-band errors, ``triton_final_response``),
cancellation reaching the model, and client shared memory on a server that allows it."""

from __future__ import annotations

import contextlib
import json
import mmap
import pathlib
import queue
import secrets
import time
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import posix_ipc
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from shoal import dtypes
from shoal.config.model_config_json import config_from_json
from shoal.dtypes import DATATYPES
from shoal.frontend.cuda_shm import torch_sees_cuda
from tests.e2e.server import ShoalServer
from tests.e2e.test_datatypes import sample

Messages = queue.Queue[tuple[Any, Any]]


@pytest.fixture(scope="module")
def client(server: ShoalServer) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(server.grpc_url)
    yield triton
    triton.close()


@pytest.fixture(scope="module")
def http(server: ShoalServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url)


@pytest.fixture(scope="module")
def stub(server: ShoalServer) -> Iterator[Any]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def grpc_error(call: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return caught.value


def add_sub_inputs(module: Any, a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> list[Any]:
    inputs = [module.InferInput("INPUT0", list(a.shape), "FP32"),
              module.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def repeat_inputs(count: int, delay: float) -> list[grpcclient.InferInput]:
    n = grpcclient.InferInput("IN", [1], "INT32")
    n.set_data_from_numpy(np.array([count], np.int32))
    d = grpcclient.InferInput("DELAY", [1], "FP32")
    d.set_data_from_numpy(np.array([delay], np.float32))
    return [n, d]


# ------------------------------------------------------------------------ non-infer RPCs


def test_health_metadata_and_config_match_http(
        server: ShoalServer, client: grpcclient.InferenceServerClient,
        http: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("add_sub") and not client.is_model_ready("add_sub", "2")
    assert client.get_server_metadata(as_json=True) == http.get_server_metadata()
    for model in ("add_sub", "mlp", "identity_all"):
        meta = client.get_model_metadata(model, as_json=True)
        for tensor in meta["inputs"] + meta["outputs"]:
            tensor["shape"] = [int(d) for d in tensor["shape"]]  # int64 -> JSON strings
        assert meta == http.get_model_metadata(model)
        config = client.get_model_config(model).config
        assert config == config_from_json(json.dumps(http.get_model_config(model)))
    with grpc.insecure_channel(server.grpc_url) as channel:
        assert channel.unary_unary("/grpc.health.v1.Health/Check")(b"") == b"\x08\x01"


def test_statistics_and_repository_index_match_http(
        client: grpcclient.InferenceServerClient, http: httpclient.InferenceServerClient) -> None:
    ones = np.ones(4, np.float32)
    client.infer("add_sub", add_sub_inputs(grpcclient, ones, ones))
    grpc_stats = client.get_inference_statistics("add_sub", as_json=True)["model_stats"][0]
    http_stats = http.get_inference_statistics("add_sub")["model_stats"][0]
    assert (grpc_stats["name"], grpc_stats["version"]) == ("add_sub", "1")
    assert int(grpc_stats["inference_count"]) == http_stats["inference_count"] >= 1
    assert (int(grpc_stats["inference_stats"]["success"]["count"])
            == http_stats["inference_stats"]["success"]["count"])
    index = client.get_model_repository_index(as_json=True)["models"]
    assert [(m["name"], m["version"], m["state"]) for m in index] == [
        (m["name"], m["version"], m["state"]) for m in http.get_model_repository_index()]


def test_load_unload_and_cuda_are_refused_and_trace_answers_as_over_http(
        server: ShoalServer, client: grpcclient.InferenceServerClient) -> None:
    for action in ("load", "unload"):
        error = grpc_error(getattr(client, f"{action}_model"), "add_sub")
        assert error.status() == "StatusCode.UNAVAILABLE"
        r = httpx.post(f"{server.base}/v2/repository/models/add_sub/{action}")
        assert r.status_code == 503 and r.json()["error"] == error.message()
    settings = client.get_trace_settings(as_json=True)["settings"]
    over_http = httpx.get(f"{server.base}/v2/trace/setting").json()
    assert {key: value["value"] for key, value in settings.items()} == {
        key: value if isinstance(value, list) else [value] for key, value in over_http.items()}
    assert client.get_cuda_shared_memory_status(as_json=True) == {}
    assert_cuda_register_refused_as_over_http(server, client)


def assert_cuda_register_refused_as_over_http(
        server: ShoalServer, client: grpcclient.InferenceServerClient) -> None:
    error = grpc_error(client.register_cuda_shared_memory, "c", b"\0" * 64, 0, 16)
    assert error.status() == "StatusCode.UNIMPLEMENTED"
    r = httpx.post(f"{server.base}/v2/cudasharedmemory/region/c/register",
                   json={"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 16})
    assert r.status_code == 501 and r.json()["error"] == error.message()


def test_system_shared_memory_is_refused_without_the_flag(
        server: ShoalServer, client: grpcclient.InferenceServerClient) -> None:
    assert client.get_system_shared_memory_status(as_json=True) == {}
    error = grpc_error(client.register_system_shared_memory, "r", "/shmtest-none", 16)
    assert error.status() == "StatusCode.UNIMPLEMENTED"
    assert "--allow-client-shm" in error.message()
    r = httpx.post(f"{server.base}/v2/systemsharedmemory/region/r/register",
                   json={"key": "/shmtest-none", "byte_size": 16})
    assert r.status_code == 501 and r.json()["error"] == error.message()


def test_log_settings_are_shared_with_http(
        server: ShoalServer, client: grpcclient.InferenceServerClient) -> None:
    updated = client.update_log_settings({"log_format": "ISO8601"}, as_json=True)
    assert updated["settings"]["log_format"]["string_param"] == "ISO8601"
    try:
        assert httpx.get(f"{server.base}/v2/logging").json()["log_format"] == "ISO8601"
        error = grpc_error(client.update_log_settings, {"log_format": "fancy"})
        r = httpx.post(f"{server.base}/v2/logging", json={"log_format": "fancy"})
        assert error.status() == "StatusCode.INVALID_ARGUMENT"
        assert r.status_code == 400 and r.json()["error"] == error.message()
    finally:
        httpx.post(f"{server.base}/v2/logging", json={"log_format": "default"})
    current = client.get_log_settings(as_json=True)["settings"]
    assert current["log_format"]["string_param"] == "default"


# ------------------------------------------------------------------------ ModelInfer


def test_add_sub_and_mlp_give_the_same_results_as_http(
        client: grpcclient.InferenceServerClient, http: httpclient.InferenceServerClient) -> None:
    a, b = np.arange(4, dtype=np.float32), np.full(4, 0.5, np.float32)
    got = client.infer("add_sub", add_sub_inputs(grpcclient, a, b), request_id="g-1")
    want = http.infer("add_sub", add_sub_inputs(httpclient, a, b))
    assert got.get_response().id == "g-1"
    for name in ("OUTPUT0", "OUTPUT1"):
        np.testing.assert_array_equal(got.as_numpy(name), want.as_numpy(name))
    np.testing.assert_array_equal(got.as_numpy("OUTPUT0"), a + b)
    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    results = []
    for module, triton in ((grpcclient, client), (httpclient, http)):
        tensor = module.InferInput("INPUT__0", [3, 256], "FP32")
        tensor.set_data_from_numpy(x)
        results.append(triton.infer("mlp", [tensor]).as_numpy("OUTPUT__0"))
    assert results[0].shape == (3, 16)
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("datatype", DATATYPES)
def test_every_datatype_round_trips_raw_like_http(
        client: grpcclient.InferenceServerClient, http: httpclient.InferenceServerClient,
        datatype: str) -> None:
    data = sample(datatype)
    answers = []
    for module, triton in ((grpcclient, client), (httpclient, http)):
        tensor = module.InferInput(f"IN_{datatype}", list(data.shape), datatype)
        tensor.set_data_from_numpy(data)
        result = triton.infer("identity_all", [tensor],
                              outputs=[module.InferRequestedOutput(f"OUT_{datatype}")])
        answers.append(result.as_numpy(f"OUT_{datatype}"))
    assert answers[0].dtype == answers[1].dtype and answers[0].shape == data.shape
    if datatype == "BYTES":
        assert answers[0].tolist() == answers[1].tolist() == data.tolist()
    else:
        np.testing.assert_array_equal(answers[0], data)
        np.testing.assert_array_equal(answers[0], answers[1])


TYPED_CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


@pytest.mark.parametrize("datatype", sorted(TYPED_CONTENTS))
def test_typed_contents_give_the_same_tensor_as_raw(stub: Any, datatype: str) -> None:
    data = sample(datatype)
    request = pb.ModelInferRequest(model_name="identity_all")
    tensor = request.inputs.add(name=f"IN_{datatype}", datatype=datatype, shape=[len(data)])
    getattr(tensor.contents, TYPED_CONTENTS[datatype]).extend(data.tolist())
    request.outputs.add(name=f"OUT_{datatype}")
    reply = stub.ModelInfer(request)
    if datatype == "BYTES":
        assert reply.raw_output_contents[0] == dtypes.serialize_bytes(data.tolist())
    else:
        assert reply.raw_output_contents[0] == data.tobytes()
    assert list(reply.outputs[0].shape) == [len(data)]


def http_error(server: ShoalServer, model: str, body: dict[str, Any]) -> tuple[int, str]:
    r = httpx.post(f"{server.base}/v2/models/{model}/infer", json=body)
    return r.status_code, r.json()["error"]


BAD_REQUESTS = {  # name -> (model, [(input name, datatype, shape)], gRPC status, HTTP status)
    "unknown model": ("nope", [("INPUT0", "FP32", [4])], "NOT_FOUND", 404),
    "missing input": ("add_sub", [("INPUT0", "FP32", [4])], "INVALID_ARGUMENT", 400),
    "unknown input": ("add_sub", [("INPUT0", "FP32", [4]), ("INPUT1", "FP32", [4]),
                                  ("EXTRA", "FP32", [4])], "INVALID_ARGUMENT", 400),
    "wrong datatype": ("add_sub", [("INPUT0", "INT32", [4]), ("INPUT1", "FP32", [4])],
                       "INVALID_ARGUMENT", 400),
    "wrong shape": ("add_sub", [("INPUT0", "FP32", [2]), ("INPUT1", "FP32", [2])],
                    "INVALID_ARGUMENT", 400),
    "batch too large": ("mlp", [("INPUT__0", "FP32", [1000, 256])], "INVALID_ARGUMENT", 400),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_errors_have_tritons_status_and_the_http_text(
        server: ShoalServer, client: grpcclient.InferenceServerClient, case: str) -> None:
    model, specs, grpc_status, http_status = BAD_REQUESTS[case]
    inputs, body_inputs = [], []
    for name, datatype, shape in specs:
        data = np.zeros(shape, dtypes.numpy_dtype(datatype))
        tensor = grpcclient.InferInput(name, shape, datatype)
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
        body_inputs.append({"name": name, "datatype": datatype, "shape": shape,
                            "data": data.reshape(-1).tolist()})
    error = grpc_error(client.infer, model, inputs)
    assert error.status() == f"StatusCode.{grpc_status}"
    assert http_error(server, model, {"inputs": body_inputs}) == (http_status, error.message())


def test_version_and_decoupled_errors(client: grpcclient.InferenceServerClient) -> None:
    ones = np.ones(4, np.float32)
    error = grpc_error(client.infer, "add_sub", add_sub_inputs(grpcclient, ones, ones),
                       model_version="9")
    assert error.status() == "StatusCode.NOT_FOUND"
    error = grpc_error(client.infer, "repeat_decoupled", repeat_inputs(1, 0.0))
    assert error.status() == "StatusCode.UNIMPLEMENTED"
    assert error.message() == ("ModelInfer RPC doesn't support models with decoupled "
                               "transaction policy")


def marker_input(path: pathlib.Path) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("MARKER", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([str(path).encode()], dtype=np.object_))
    return [tensor]


def wait_for_text(path: pathlib.Path, timeout: float = 8.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.05)
    return ""


def test_a_deadline_cancels_the_running_request(
        client: grpcclient.InferenceServerClient, tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "deadline"
    error = grpc_error(client.infer, "cancel_probe", marker_input(marker), client_timeout=0.5)
    assert error.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert wait_for_text(marker) == "cancelled"


# ------------------------------------------------------------------------ ModelStreamInfer


def gather(results: Messages, count: int) -> list[tuple[Any, Any]]:
    return [results.get(timeout=10) for _ in range(count)]


def test_stream_multiplexes_decoupled_and_plain_requests(
        client: grpcclient.InferenceServerClient) -> None:
    results: Messages = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("repeat_decoupled", repeat_inputs(3, 0.02), request_id="three",
                                  enable_empty_final_response=True)
        ones = np.ones(4, np.float32)
        client.async_stream_infer("add_sub", add_sub_inputs(grpcclient, ones, ones),
                                  request_id="plain")
        client.async_stream_infer("repeat_decoupled", repeat_inputs(2, 0.0), request_id="two")
        messages = gather(results, 7)  # 3 + the empty final, 1, 2 (no final: not asked for)
    finally:
        client.stop_stream()
    by_id: dict[str, list[Any]] = {}
    for result, error in messages:
        assert error is None
        by_id.setdefault(result.get_response().id, []).append(result)

    def summary(request_id: str) -> list[tuple[list[int] | None, bool]]:
        return [(None if not r.get_response().outputs else r.as_numpy("OUT").tolist(),
                 r.get_response().parameters["triton_final_response"].bool_param)
                for r in by_id[request_id]]

    assert summary("three") == [([0], False), ([1], False), ([2], False), (None, True)]
    assert summary("two") == [([0], False), ([1], False)]
    (plain,) = by_id["plain"]
    assert plain.get_response().parameters["triton_final_response"].bool_param
    np.testing.assert_array_equal(plain.as_numpy("OUTPUT0"), ones + ones)
    assert results.empty()


class RequestFeed:
    """A request iterator for the raw stub that stays open until closed."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()

    def send(self, request: Any) -> None:
        self._queue.put(request)

    def close(self) -> None:
        self._queue.put(None)

    def __iter__(self) -> Iterator[Any]:
        while (request := self._queue.get()) is not None:
            yield request


def test_stream_errors_are_in_band_and_the_stream_stays_open(
        server: ShoalServer, stub: Any) -> None:
    feed = RequestFeed()
    replies = stub.ModelStreamInfer(iter(feed))
    try:
        bad = pb.ModelInferRequest(model_name="add_sub", id="bad")
        bad.inputs.add(name="INPUT0", datatype="FP32", shape=[4])
        bad.raw_input_contents.append(b"\0" * 16)
        feed.send(bad)
        error = next(replies)
        body = {"id": "bad", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4],
                                         "data": [0, 0, 0, 0]}]}
        assert error.error_message == http_error(server, "add_sub", body)[1]
        assert error.error_message.startswith("[request id: bad] ")  # Triton names the request
        assert error.infer_response.id == "bad"
        # refused before it was issued: Triton sends the error and the id, no final flag
        assert "triton_final_response" not in error.infer_response.parameters
        failing = pb.ModelInferRequest(model_name="repeat_decoupled", id="negative")
        failing.inputs.add(name="IN", datatype="INT32", shape=[1])
        failing.inputs.add(name="DELAY", datatype="FP32", shape=[1])
        failing.raw_input_contents.extend([np.array([-1], np.int32).tobytes(),
                                           np.array([0], np.float32).tobytes()])
        feed.send(failing)
        first, last = next(replies), next(replies)
        assert not first.error_message
        assert not first.infer_response.parameters["triton_final_response"].bool_param
        assert (last.error_message, last.infer_response.id) == ("negative count", "negative")
        assert last.infer_response.parameters["triton_final_response"].bool_param
        good = pb.ModelInferRequest(model_name="add_sub", id="good")
        for name in ("INPUT0", "INPUT1"):
            good.inputs.add(name=name, datatype="FP32", shape=[4])
            good.raw_input_contents.append(np.ones(4, np.float32).tobytes())
        feed.send(good)
        reply = next(replies)
        assert (reply.error_message, reply.infer_response.id) == ("", "good")
    finally:
        feed.close()
    assert list(replies) == []


def test_cancelling_a_stream_cancels_its_running_request(
        client: grpcclient.InferenceServerClient, tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "stream"
    results: Messages = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("cancel_probe", marker_input(marker), request_id="probe")
        time.sleep(0.5)  # running in the model now
    finally:
        client.stop_stream(cancel_requests=True)
    assert wait_for_text(marker) == "cancelled"


# ------------------------------------------------------------------------ client shared memory


@contextlib.contextmanager
def shm_object(size: int) -> Iterator[tuple[str, Any]]:
    key = f"/shmtest-{secrets.token_hex(6)}"
    memory = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, mode=0o600, size=size)
    try:
        yield key, memory
    finally:
        memory.close_fd()
        posix_ipc.unlink_shared_memory(key)


def test_system_shared_memory_inputs_and_outputs(shm_server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(shm_server.grpc_url)
    with shm_object(64) as (key, memory), mmap.mmap(memory.fd, 64) as view:
        view[0:32] = np.arange(4, dtype=np.float32).tobytes() + np.ones(4, np.float32).tobytes()
        client.register_system_shared_memory("io", key, 64)
        try:
            status = client.get_system_shared_memory_status(as_json=True)["regions"]
            assert status["io"]["key"] == key and int(status["io"]["byte_size"]) == 64
            inputs = add_sub_inputs(grpcclient, np.zeros(4, np.float32), np.zeros(4, np.float32))
            inputs[0].set_shared_memory("io", 16, offset=0)
            inputs[1].set_shared_memory("io", 16, offset=16)
            output = grpcclient.InferRequestedOutput("OUTPUT0")
            output.set_shared_memory("io", 16, offset=32)
            result = client.infer("add_sub", inputs, outputs=[output])
            (meta,) = result.get_response().outputs
            assert (meta.name, meta.datatype, list(meta.shape)) == ("OUTPUT0", "FP32", [4])
            np.testing.assert_array_equal(np.frombuffer(view[32:48], np.float32),
                                          np.arange(4) + 1.0)
            inputs[1].set_shared_memory("missing", 16)
            error = grpc_error(client.infer, "add_sub", inputs, outputs=[output])
            assert error.status() == "StatusCode.NOT_FOUND"
            assert "'missing'" in error.message()
        finally:
            client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status(as_json=True) == {}
    if not torch_sees_cuda():  # with a device it registers (test_cuda_shm_on_a_gpu.py)
        assert_cuda_register_refused_as_over_http(shm_server, client)
    client.unregister_cuda_shared_memory()  # nothing to do, not an error
    assert client.get_cuda_shared_memory_status(as_json=True) == {}
    client.close()
