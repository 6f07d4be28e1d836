"""The tensorflow backend through the real processes: SavedModels built in a fixture with
``tf.Module``, configs without inputs and outputs (auto-complete from the signature) and full
configs, outputs equal to the SavedModel called in TensorFlow in process over HTTP and gRPC,
BYTES / FP16, dynamic batching merging requests, and a corrupt saved_model.pb failing its load
clearly while the other models keep serving (corrupt variables, caught by the worker's load:
tests/workers/test_tensorflow_backend.py)."""

from __future__ import annotations

import pathlib
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

models = pytest.importorskip("tests.tensorflow_models")
tf = models.tf

# three workers, each importing TensorFlow: 40 s for one at load 24 on 2 cores, so the start
# may take minutes on a busy machine
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SERVED = ("mlp", "strings", "batcher")
ONE_INSTANCE = "instance_group [ { kind: KIND_CPU count: 1 } ]\n"

STRINGS = textwrap.dedent("""
    platform: "tensorflow_savedmodel"
    max_batch_size: 4
    input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 2 ] },
            { name: "HALF" data_type: TYPE_FP16 dims: [ 3 ] } ]
    output [ { name: "UPPER" data_type: TYPE_STRING dims: [ 2 ] },
             { name: "LENGTH" data_type: TYPE_INT32 dims: [ 2 ] },
             { name: "HALF_OUT" data_type: TYPE_FP16 dims: [ 3 ] } ]
""") + ONE_INSTANCE

BATCHER = textwrap.dedent("""
    backend: "tensorflow"
    max_batch_size: 8
    dynamic_batching { max_queue_delay_microseconds: 50000 }
""") + ONE_INSTANCE  # inputs and outputs from the signature; the platform from the directory

@pytest.fixture(scope="module")
def tf_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    repo = tmp_path_factory.mktemp("tensorflow")
    # a config naming only the instance count (one TensorFlow worker: each import takes seconds
    # on a loaded machine); everything else from the signature
    models.write_model(repo, "mlp", models.Mlp(), ONE_INSTANCE)
    models.write_model(repo, "strings", models.Strings(), STRINGS)
    models.write_model(repo, "batcher", models.AddSub(), BATCHER)
    corrupt = repo / "corrupt" / "1" / "model.savedmodel"  # auto-complete reads it
    corrupt.mkdir(parents=True)
    (corrupt / "saved_model.pb").write_bytes(b"\x12\x09 not a SavedModel")
    return repo


@pytest.fixture(scope="module")
def tf_server(tf_repo: pathlib.Path) -> Iterator[ShoalServer]:
    server = ShoalServer([str(tf_repo)], ["--exit-on-error=false", "--strict-readiness=false"])
    with serving(server) as srv:
        _wait_models_ready(srv, SERVED)
        yield srv


def _wait_models_ready(server: ShoalServer, names: tuple[str, ...]) -> None:
    deadline = time.monotonic() + 480
    pending = list(names)
    while pending and time.monotonic() < deadline:
        pending = [n for n in pending
                   if httpx.get(f"{server.base}/v2/models/{n}/ready").status_code != 200]
        time.sleep(0.3)
    assert not pending, f"models not ready: {pending}\n{server.log()}"


def _in_process(repo: pathlib.Path, name: str, feeds: dict[str, Any]) -> Any:
    """The served SavedModel, called by TensorFlow in this process."""
    path = repo / name / "1" / "model.savedmodel"
    return tf.saved_model.load(str(path)).signatures["serving_default"](
        **{key: tf.constant(value) for key, value in feeds.items()})


def test_auto_complete_without_config_is_what_triton_writes(tf_server: ShoalServer) -> None:
    config = httpx.get(f"{tf_server.base}/v2/models/mlp/config").json()
    assert config["platform"] == "tensorflow_savedmodel" and config["backend"] == "tensorflow"
    assert config["max_batch_size"] == 4
    assert "dynamic_batching" in config
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("x", "TYPE_FP32", [4])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("y", "TYPE_FP32", [3])]
    assert config["default_model_filename"] == "model.savedmodel"


def test_mlp_over_http_and_grpc_equals_tensorflow_in_process(tf_server: ShoalServer,
                                                            tf_repo: pathlib.Path) -> None:
    x = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    expected = _in_process(tf_repo, "mlp", {"x": x})["y"].numpy()
    http_input = httpclient.InferInput("x", [3, 4], "FP32")
    http_input.set_data_from_numpy(x)
    got = httpclient.InferenceServerClient(tf_server.url).infer("mlp", [http_input])
    np.testing.assert_array_equal(got.as_numpy("y"), expected)
    grpc_input = grpcclient.InferInput("x", [3, 4], "FP32")
    grpc_input.set_data_from_numpy(x)
    got_grpc = grpcclient.InferenceServerClient(tf_server.grpc_url).infer("mlp", [grpc_input])
    np.testing.assert_array_equal(got_grpc.as_numpy("y"), expected)


def test_bytes_and_fp16_round_trip(tf_server: ShoalServer, tf_repo: pathlib.Path) -> None:
    text = np.array([["ünï".encode(), b""], [b"ab", b"c\x00d"]], dtype=np.object_)
    half = np.array([[1.5, -2, 1024], [0, 0.25, 3]], np.float16)
    inputs = [httpclient.InferInput("TEXT", [2, 2], "BYTES"),
              httpclient.InferInput("HALF", [2, 3], "FP16")]
    inputs[0].set_data_from_numpy(text)
    inputs[1].set_data_from_numpy(half)
    result = httpclient.InferenceServerClient(tf_server.url).infer("strings", inputs)
    expected = _in_process(tf_repo, "strings", {"TEXT": text, "HALF": half})
    assert result.as_numpy("UPPER").tolist() == expected["UPPER"].numpy().tolist()
    np.testing.assert_array_equal(result.as_numpy("LENGTH"), expected["LENGTH"].numpy())
    np.testing.assert_array_equal(result.as_numpy("HALF_OUT"), half * 2)


def test_dynamic_batching_merges_concurrent_requests(tf_server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(tf_server.url, concurrency=16)
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


def test_a_corrupt_model_fails_its_load_clearly_and_others_serve(
        tf_server: ShoalServer, tf_repo: pathlib.Path,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    index = {entry["name"]: entry for entry in
             httpx.post(f"{tf_server.base}/v2/repository/index").json()}
    corrupt = index["corrupt"]
    assert corrupt["state"] == "UNAVAILABLE"
    assert "auto-complete from the SavedModel signature failed" in corrupt["reason"]
    assert "model.savedmodel/saved_model.pb cannot be parsed: not a SavedModel" in \
        corrupt["reason"]
    assert str(tmp_path_factory.getbasetemp()) not in corrupt["reason"]
    assert all(index[name]["state"] == "READY" for name in SERVED)
    x = np.ones((1, 4), np.float32)
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(x)
    result = httpclient.InferenceServerClient(tf_server.url).infer("mlp", [tensor])
    np.testing.assert_array_equal(result.as_numpy("y"),
                                  _in_process(tf_repo, "mlp", {"x": x})["y"].numpy())


def test_bad_input_gets_a_400_naming_the_field(tf_server: ShoalServer) -> None:
    body = {"inputs": [{"name": "x", "shape": [1, 5], "datatype": "FP32",
                        "data": [1, 2, 3, 4, 5]}]}
    response = httpx.post(f"{tf_server.base}/v2/models/mlp/infer", json=body)
    assert response.status_code == 400
    assert "'x'" in response.json()["error"]
