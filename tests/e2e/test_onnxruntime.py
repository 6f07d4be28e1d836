"""The onnxruntime backend through the real processes: models built in a fixture with the onnx
helper API, no config.pbtxt (auto-complete) and partial or full configs, outputs equal to ONNX
Runtime called in process over HTTP and gRPC, BYTES / FP16 / BF16, dynamic batching merging
requests, implicit sequence state, and a corrupt model.onnx failing its load clearly while the
other models keep serving."""

from __future__ import annotations

import concurrent.futures
import secrets
import textwrap
import time
from collections.abc import Iterator

import httpx
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as triton_shm

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

ort = pytest.importorskip("onnxruntime")
models = pytest.importorskip("tests.onnx_models")

pytestmark = pytest.mark.e2e

MODELS = ("add_sub", "mlp", "strings", "bf16", "batcher", "accumulate")

BATCHER = textwrap.dedent("""
    backend: "onnxruntime"
    max_batch_size: 8
    dynamic_batching { max_queue_delay_microseconds: 50000 }
    instance_group [ { kind: KIND_CPU count: 1 } ]
""")  # inputs and outputs from the graph

ACCUMULATE = textwrap.dedent("""
    platform: "onnxruntime_onnx"
    max_batch_size: 2
    sequence_batching {
      state [ { input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_INT64 dims: [ 1 ] } ]
    }
    input [ { name: "VALUE" data_type: TYPE_INT64 dims: [ 1 ] } ]
    output [ { name: "SUM" data_type: TYPE_INT64 dims: [ 1 ] } ]
    instance_group [ { kind: KIND_CPU count: 1 } ]
""")

ONE_INSTANCE = 'instance_group [ { kind: KIND_CPU count: 1 } ]\n'

CORRUPT_CONFIG = textwrap.dedent("""
    backend: "onnxruntime"
    input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    instance_group [ { kind: KIND_CPU count: 1 } ]
""")


@pytest.fixture(scope="module")
def onnx_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("onnx")
    models.write_model(repo, "add_sub", models.add_sub())  # no config.pbtxt at all
    models.write_model(repo, "mlp", models.mlp(), ONE_INSTANCE, as_directory=True)
    models.write_model(repo, "strings", models.strings_and_half(), ONE_INSTANCE)
    models.write_model(repo, "bf16", models.bf16_scale(), ONE_INSTANCE)
    models.write_model(repo, "batcher", models.add_sub(), BATCHER)
    models.write_model(repo, "accumulate", models.accumulate(), ACCUMULATE)
    for name in ("corrupt", "corrupt_with_config"):  # auto-complete / the worker finds it
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.onnx").write_bytes(b"\x08\x07 this is not a model")
    (repo / "corrupt_with_config" / "config.pbtxt").write_text(CORRUPT_CONFIG)
    server = ShoalServer([str(repo)], ["--exit-on-error=false", "--strict-readiness=false",
                                       "--allow-client-shm=true"])
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


def test_auto_complete_without_config_is_what_triton_writes(onnx_server: ShoalServer) -> None:
    config = httpx.get(f"{onnx_server.base}/v2/models/add_sub/config").json()
    assert config["platform"] == "onnxruntime_onnx" and config["backend"] == "onnxruntime"
    assert config["max_batch_size"] == 4
    assert "dynamic_batching" in config
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [4]), ("INPUT1", "TYPE_FP32", [4])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("OUTPUT0", "TYPE_FP32", [4]), ("OUTPUT1", "TYPE_FP32", [4])]
    assert config["default_model_filename"] == "model.onnx"
    assert [g["count"] for g in config["instance_group"]] == [2]  # Triton's ONNX default


def test_mlp_over_http_and_grpc_equals_onnxruntime_in_process(onnx_server: ShoalServer) -> None:
    x = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    session = ort.InferenceSession(models.mlp(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    http_input = httpclient.InferInput("x", [3, 4], "FP32")
    http_input.set_data_from_numpy(x)
    got = httpclient.InferenceServerClient(onnx_server.url).infer("mlp", [http_input])
    np.testing.assert_array_equal(got.as_numpy("y"), expected)
    grpc_input = grpcclient.InferInput("x", [3, 4], "FP32")
    grpc_input.set_data_from_numpy(x)
    got_grpc = grpcclient.InferenceServerClient(onnx_server.grpc_url).infer("mlp", [grpc_input])
    np.testing.assert_array_equal(got_grpc.as_numpy("y"), expected)


def test_bytes_and_fp16_round_trip(onnx_server: ShoalServer) -> None:
    text = np.array([["ünï".encode(), b""]], dtype=np.object_)
    half = np.array([[1.5, -2, 1024]], np.float16)
    inputs = [httpclient.InferInput("TEXT", [1, 2], "BYTES"),
              httpclient.InferInput("HALF", [1, 3], "FP16")]
    inputs[0].set_data_from_numpy(text)
    inputs[1].set_data_from_numpy(half)
    result = httpclient.InferenceServerClient(onnx_server.url).infer("strings", inputs)
    assert result.as_numpy("TEXT_OUT").tolist() == text.tolist()
    np.testing.assert_array_equal(result.as_numpy("HALF_OUT"), half * 2)


def test_bf16_round_trip(onnx_server: ShoalServer) -> None:
    values = np.array([[1.5, -3.0]], dtype=ml_dtypes.bfloat16)
    inp = httpclient.InferInput("B", [1, 2], "BF16")
    inp.set_data_from_numpy(values)
    result = httpclient.InferenceServerClient(onnx_server.url).infer("bf16", [inp])
    np.testing.assert_array_equal(result.as_numpy("B_OUT"), values * 2)


def test_dynamic_batching_merges_concurrent_requests(onnx_server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(onnx_server.url, concurrency=16)
    rows = [np.full((1, 4), i, np.float32) for i in range(16)]

    def inputs(row: np.ndarray) -> list[httpclient.InferInput]:
        pair = [httpclient.InferInput("INPUT0", [1, 4], "FP32"),
                httpclient.InferInput("INPUT1", [1, 4], "FP32")]
        pair[0].set_data_from_numpy(row)
        pair[1].set_data_from_numpy(np.ones((1, 4), np.float32))
        return pair

    pending = [client.async_infer("batcher", inputs(row)) for row in rows]
    answers = [p.get_result().as_numpy("OUTPUT0") for p in pending]
    for row, answer in zip(rows, answers, strict=True):
        np.testing.assert_array_equal(answer, row + 1)
    stats = client.get_inference_statistics("batcher")["model_stats"][0]
    sizes = [b["batch_size"] for b in stats["batch_stats"]]
    assert max(sizes) > 1, f"no execution merged requests: {sizes}"
    assert stats["inference_count"] == 16 and stats["execution_count"] < 16


def test_implicit_state_carries_each_sequence(onnx_server: ShoalServer) -> None:
    def run(sequence: int) -> list[int]:
        client = httpclient.InferenceServerClient(onnx_server.url)
        sums = []
        for step, value in enumerate([3, 1, 4, 1, 5]):
            inp = httpclient.InferInput("VALUE", [1, 1], "INT64")
            inp.set_data_from_numpy(np.array([[value * sequence]], np.int64))
            result = client.infer("accumulate", [inp], sequence_id=sequence,
                                  sequence_start=step == 0, sequence_end=step == 4)
            sums.append(int(result.as_numpy("SUM")[0, 0]))
        return sums

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        got = dict(zip([1, 2, 3], pool.map(run, [1, 2, 3]), strict=True))
    for sequence, sums in got.items():
        assert sums == list(np.cumsum([v * sequence for v in [3, 1, 4, 1, 5]]))


def test_corrupt_model_fails_its_load_clearly_and_others_serve(
        onnx_server: ShoalServer, tmp_path_factory: pytest.TempPathFactory) -> None:
    deadline = time.monotonic() + 60
    while True:  # the worker's load of corrupt_with_config may still be failing
        index = {entry["name"]: entry for entry in
                 httpx.post(f"{onnx_server.base}/v2/repository/index").json()}
        if index["corrupt_with_config"].get("reason") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    corrupt, corrupt_with_config = index["corrupt"], index["corrupt_with_config"]
    assert corrupt["state"] == corrupt_with_config["state"] == "UNAVAILABLE"
    assert "auto-complete from the ONNX graph failed: ONNX model 'model.onnx' cannot be " \
           "parsed" in corrupt["reason"]
    assert "cannot load ONNX model 'model.onnx'" in corrupt_with_config["reason"]
    for reason in (corrupt["reason"], corrupt_with_config["reason"]):
        assert str(tmp_path_factory.getbasetemp()) not in reason
    assert all(index[name]["state"] == "READY" for name in MODELS)
    one = np.ones((1, 4), np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 4], "FP32"),
              httpclient.InferInput("INPUT1", [1, 4], "FP32")]
    for inp in inputs:
        inp.set_data_from_numpy(one)
    result = httpclient.InferenceServerClient(onnx_server.url).infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 4), np.float32))


def test_bad_input_gets_a_400_naming_the_field(onnx_server: ShoalServer) -> None:
    body = {"inputs": [{"name": "x", "shape": [1, 5], "datatype": "FP32",
                        "data": [1, 2, 3, 4, 5]}]}
    response = httpx.post(f"{onnx_server.base}/v2/models/mlp/infer", json=body)
    assert response.status_code == 400
    assert "'x'" in response.json()["error"]


def test_client_shared_memory_output_next_to_an_arena_output(onnx_server: ShoalServer) -> None:
    """add_sub's outputs are written into slots lent to ONNX Runtime: OUTPUT0 asked into a
    client's system shared-memory region is copied there, OUTPUT1 comes from the arena; both
    are right, request after request (the lent slot nobody references is given back)."""
    client = httpclient.InferenceServerClient(onnx_server.url)
    tag = secrets.token_hex(6)
    region = triton_shm.create_shared_memory_region("onnx_out", f"/onnx-out-{tag}", 64)
    try:
        client.register_system_shared_memory("onnx_out", f"/onnx-out-{tag}", 64)
        for step in range(3):
            a = np.arange(8, dtype=np.float32).reshape(2, 4) + step
            b = np.full((2, 4), 0.5, np.float32)
            inputs = [httpclient.InferInput("INPUT0", [2, 4], "FP32"),
                      httpclient.InferInput("INPUT1", [2, 4], "FP32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
                       httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
            outputs[0].set_shared_memory("onnx_out", 32)
            result = client.infer("add_sub", inputs, outputs=outputs)
            np.testing.assert_array_equal(
                triton_shm.get_contents_as_numpy(region, np.float32, [2, 4]), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        client.unregister_system_shared_memory("onnx_out")
    finally:
        triton_shm.destroy_shared_memory_region(region)
