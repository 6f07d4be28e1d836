"""The openvino backend through the real processes: IR models built in a fixture with
openvino's opset API (no downloads), a partial config completed from the model (auto-complete),
outputs equal to OpenVINO called in process over HTTP and gRPC, an ONNX model read through
OpenVINO, dynamic batching merging requests (the batch statistics show it), and a corrupt
model.xml failing its load clearly while the other models keep serving."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

ov = pytest.importorskip("openvino")
models = pytest.importorskip("tests.openvino_models")
onnx_models = pytest.importorskip("tests.onnx_models")

pytestmark = pytest.mark.e2e

MODELS = ("mlp", "batcher", "onnx_add_sub")

MLP = textwrap.dedent("""
    backend: "openvino"
    instance_group [ { kind: KIND_CPU count: 1 } ]
""")  # max_batch_size, dynamic_batching, inputs and outputs from the model

BATCHER = textwrap.dedent("""
    backend: "openvino"
    max_batch_size: 8
    dynamic_batching { max_queue_delay_microseconds: 50000 }
    instance_group [ { kind: KIND_CPU count: 1 } ]
    parameters { key: "PERFORMANCE_HINT" value { string_value: "THROUGHPUT" } }
""")

ONNX_ADD_SUB = textwrap.dedent("""
    backend: "openvino"
    default_model_filename: "model.onnx"
    max_batch_size: 4
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
            { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
             { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
""")

CORRUPT = 'backend: "openvino"\n'
CORRUPT_WITH_CONFIG = textwrap.dedent("""
    backend: "openvino"
    max_batch_size: 2
    dynamic_batching { }
    input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    instance_group [ { kind: KIND_CPU count: 1 } ]
""")


@pytest.fixture(scope="module")
def ov_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("openvino")
    models.write_model(repo, "mlp", models.mlp(), MLP)
    models.write_model(repo, "batcher", models.add_sub(), BATCHER)
    onnx_models.write_model(repo, "onnx_add_sub", onnx_models.add_sub(), ONNX_ADD_SUB)
    for name, config in (("corrupt", CORRUPT), ("corrupt_with_config", CORRUPT_WITH_CONFIG)):
        # auto-complete reads the first; the second's full config leaves the worker to find it
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.xml").write_text("<net> this is not a model")
        (repo / name / "1" / "model.bin").write_bytes(b"\0" * 16)
        (repo / name / "config.pbtxt").write_text(config)
    server = ShoalServer([str(repo)], ["--exit-on-error=false", "--strict-readiness=false"])
    with serving(server) as srv:
        _wait_models_ready(srv, MODELS)
        yield srv


def _wait_models_ready(server: ShoalServer, names: tuple[str, ...]) -> None:
    deadline = time.monotonic() + 90
    pending = list(names)
    while pending and time.monotonic() < deadline:
        pending = [n for n in pending
                   if httpx.get(f"{server.base}/v2/models/{n}/ready").status_code != 200]
        time.sleep(0.2)
    assert not pending, f"models not ready: {pending}\n{server.log()}"


def test_auto_complete_fills_the_config_from_the_model(ov_server: ShoalServer) -> None:
    config = httpx.get(f"{ov_server.base}/v2/models/mlp/config").json()
    assert config["backend"] == "openvino"
    assert config["max_batch_size"] == 4  # batch layouts on every tensor: the default
    assert "dynamic_batching" in config
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("x", "TYPE_FP32", [4])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("y", "TYPE_FP32", [3])]
    assert config["default_model_filename"] == "model.xml"


def test_mlp_over_http_and_grpc_equals_openvino_in_process(ov_server: ShoalServer) -> None:
    x = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    expected = models.reference(models.mlp(), {"x": x})[0]
    http_input = httpclient.InferInput("x", [3, 4], "FP32")
    http_input.set_data_from_numpy(x)
    got = httpclient.InferenceServerClient(ov_server.url).infer("mlp", [http_input])
    np.testing.assert_allclose(got.as_numpy("y"), expected, rtol=1e-6, atol=1e-6)
    grpc_input = grpcclient.InferInput("x", [3, 4], "FP32")
    grpc_input.set_data_from_numpy(x)
    got_grpc = grpcclient.InferenceServerClient(ov_server.grpc_url).infer("mlp", [grpc_input])
    np.testing.assert_allclose(got_grpc.as_numpy("y"), expected, rtol=1e-6, atol=1e-6)


def test_onnx_model_is_served_through_openvino(ov_server: ShoalServer) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    inputs = [httpclient.InferInput("INPUT0", [2, 4], "FP32"),
              httpclient.InferInput("INPUT1", [2, 4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones((2, 4), np.float32))
    result = httpclient.InferenceServerClient(ov_server.url).infer("onnx_add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - 1)


def test_dynamic_batching_merges_concurrent_requests(ov_server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(ov_server.url, concurrency=16)
    rows = [np.full((1, 4), i, np.float32) for i in range(16)]

    def inputs(row: np.ndarray) -> list[httpclient.InferInput]:
        pair = [httpclient.InferInput("INPUT0", [1, 4], "FP32"),
                httpclient.InferInput("INPUT1", [1, 4], "FP32")]
        pair[0].set_data_from_numpy(row)
        pair[1].set_data_from_numpy(np.ones((1, 4), np.float32))
        return pair

    pending = [client.async_infer("batcher", inputs(row)) for row in rows]
    answers = [p.get_result() for p in pending]
    for row, answer in zip(rows, answers, strict=True):
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), row + 1)
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT1"), row - 1)
    stats = client.get_inference_statistics("batcher")["model_stats"][0]
    sizes = [b["batch_size"] for b in stats["batch_stats"]]
    assert max(sizes) > 1, f"no execution merged requests: {sizes}"
    assert stats["inference_count"] == 16 and stats["execution_count"] < 16


def test_corrupt_model_fails_its_load_clearly_and_others_serve(
        ov_server: ShoalServer, tmp_path_factory: pytest.TempPathFactory) -> None:
    deadline = time.monotonic() + 60
    while True:  # the worker's load of corrupt_with_config may still be failing
        index = {entry["name"]: entry for entry in
                 httpx.post(f"{ov_server.base}/v2/repository/index").json()}
        if index["corrupt_with_config"].get("reason") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    corrupt, corrupt_with_config = index["corrupt"], index["corrupt_with_config"]
    assert corrupt["state"] == corrupt_with_config["state"] == "UNAVAILABLE"
    assert "auto-complete from the OpenVINO model failed: cannot read the model" \
        in corrupt["reason"]
    assert "cannot read OpenVINO model 'model.xml'" in corrupt_with_config["reason"]
    for reason in (corrupt["reason"], corrupt_with_config["reason"]):
        assert str(tmp_path_factory.getbasetemp()) not in reason
    assert all(index[name]["state"] == "READY" for name in MODELS)
    x = np.ones((1, 4), np.float32)
    inp = httpclient.InferInput("x", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    result = httpclient.InferenceServerClient(ov_server.url).infer("mlp", [inp])
    np.testing.assert_allclose(result.as_numpy("y"), models.reference(models.mlp(), {"x": x})[0],
                               rtol=1e-6, atol=1e-6)


def test_bad_input_gets_a_400_naming_the_field(ov_server: ShoalServer) -> None:
    body = {"inputs": [{"name": "x", "shape": [1, 5], "datatype": "FP32",
                        "data": [1, 2, 3, 4, 5]}]}
    response = httpx.post(f"{ov_server.base}/v2/models/mlp/infer", json=body)
    assert response.status_code == 400
    assert "'x'" in response.json()["error"]
