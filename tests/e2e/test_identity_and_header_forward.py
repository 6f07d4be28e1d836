"""The built-in ``identity`` backend (Triton's: ``INPUT<n>`` answered as ``OUTPUT<n>``, no
model file) and ``--http-header-forward-pattern`` / ``--grpc-header-forward-pattern``, which pass
matching request headers to the model as request parameters: one server, tritonclient over HTTP
and gRPC (unary and streaming), a python model that answers with the parameters it was given,
and an ensemble that runs the identity model before it (headers reach the composing models)."""

from __future__ import annotations

import json
import pathlib
import queue
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

pytestmark = pytest.mark.e2e

IDENTITY = """
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "INPUT1" data_type: TYPE_STRING dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "OUTPUT1" data_type: TYPE_STRING dims: [ 2 ] } ]
parameters [ { key: "execute_delay_ms" value: { string_value: "20" } } ]
"""

# an input without its OUTPUT<n>: the identity backend refuses to load it
IDENTITY_MISMATCHED = """
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

PARAMS_ECHO = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

PARAMS_ECHO_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "PARAMS", np.array([r.parameters().encode()], dtype=object))])
                for r in requests]
"""

ECHO_AFTER_IDENTITY = """
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "identity_scalar" model_version: -1
    input_map { key: "INPUT0" value: "X" } output_map { key: "OUTPUT0" value: "Y" } },
  { model_name: "params_echo" model_version: -1
    input_map { key: "INPUT0" value: "Y" } output_map { key: "PARAMS" value: "PARAMS" } }
] }
"""

IDENTITY_SCALAR = """
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

HEADERS = {"my_header_1": "my value 1", "my_header_2": 'a "quoted" value\\ ',
           "header_3": "not forwarded"}
FORWARDED = {"my_header_1": "my value 1", "my_header_2": 'a "quoted" value\\ '}


def _model(repo: pathlib.Path, name: str, config: str, model_py: str | None = None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    if model_py is not None:
        (repo / name / "1" / "model.py").write_text(model_py)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("identity_headers")
    _model(repo, "identity", IDENTITY)
    _model(repo, "identity_mismatched", IDENTITY_MISMATCHED)
    _model(repo, "identity_scalar", IDENTITY_SCALAR)
    _model(repo, "params_echo", PARAMS_ECHO, PARAMS_ECHO_MODEL)
    _model(repo, "echo_after_identity", ECHO_AFTER_IDENTITY)
    # HTTP: case-insensitive by default (the upper-case pattern matches lower-case names);
    # gRPC: made case-sensitive by (?-i), and metadata names are lower case
    args = ["--exit-on-error=false", "--strict-readiness=false",
            "--http-header-forward-pattern", "MY_HEADER.*",
            "--grpc-header-forward-pattern", "(?-i)my_header.*"]
    with serving(ShoalServer([str(repo)], args)) as srv:
        _wait_until_settled(srv)
        yield srv


def _wait_until_settled(srv: ShoalServer, timeout: float = 60.0) -> None:
    """Every model of the repository ready or failed (readiness is not strict here)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        index = httpx.post(f"{srv.base}/v2/repository/index", json={}, timeout=10).json()
        if len(index) == 5 and all(m.get("state") in ("READY", "UNAVAILABLE") for m in index):
            return
        time.sleep(0.1)
    raise TimeoutError(f"models not settled: {index}")


def _identity_inputs(module: Any, batch: int) -> tuple[list[Any], np.ndarray, np.ndarray]:
    floats = np.arange(batch * 3, dtype=np.float32).reshape(batch, 3) / 7
    strings = np.array([[f"row{i}".encode(), b"\x00\xffbytes"] for i in range(batch)],
                       dtype=object)
    inputs = [module.InferInput("INPUT0", list(floats.shape), "FP32"),
              module.InferInput("INPUT1", list(strings.shape), "BYTES")]
    inputs[0].set_data_from_numpy(floats)
    inputs[1].set_data_from_numpy(strings)
    return inputs, floats, strings


def test_identity_answers_each_input_unchanged_over_http_and_grpc(server: ShoalServer) -> None:
    for module, client in ((httpclient, httpclient.InferenceServerClient(server.url)),
                           (grpcclient, grpcclient.InferenceServerClient(server.grpc_url))):
        inputs, floats, strings = _identity_inputs(module, 3)
        result = client.infer("identity", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), floats)
        assert result.as_numpy("OUTPUT0").dtype == np.float32
        assert result.as_numpy("OUTPUT1").tolist() == strings.tolist()
        client.close()


def test_identity_takes_the_model_s_execute_delay(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    inputs, _, _ = _identity_inputs(httpclient, 1)
    for _ in range(3):
        client.infer("identity", inputs)
    stats = client.get_inference_statistics("identity")["model_stats"][0]
    infer = stats["inference_stats"]["compute_infer"]
    assert infer["count"] >= 3
    assert infer["ns"] / infer["count"] >= 20e6  # execute_delay_ms 20, per execution


def test_identity_refuses_a_config_without_the_matching_output(server: ShoalServer) -> None:
    index = httpx.post(f"{server.base}/v2/repository/index", json={}, timeout=10).json()
    entry = next(m for m in index if m["name"] == "identity_mismatched")
    assert entry["state"] == "UNAVAILABLE"
    assert "needs an output 'OUTPUT0' of datatype FP32" in entry["reason"]


def _scalar_input(module: Any) -> list[Any]:
    tensor = module.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.5], dtype=np.float32))
    return [tensor]


def _params(result: Any) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(result.as_numpy("PARAMS")[0])
    return value


def test_http_headers_matching_the_pattern_reach_the_model(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    result = client.infer("params_echo", _scalar_input(httpclient), headers=dict(HEADERS),
                          parameters={"own": 7, "my_header_1": "the request's"})
    assert _params(result) == {"own": 7, "my_header_1": "the request's",
                               "my_header_2": FORWARDED["my_header_2"]}
    plain = client.infer("params_echo", _scalar_input(httpclient))
    assert _params(plain) == {}


def test_grpc_metadata_matching_the_pattern_reaches_the_model(server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    result = client.infer("params_echo", _scalar_input(grpcclient), headers=dict(HEADERS),
                          parameters={"own": "x"})
    assert _params(result) == {"own": "x", **FORWARDED}
    client.close()


def test_grpc_stream_metadata_reaches_every_request_of_the_stream(server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result),
                        headers=dict(HEADERS))
    for n in range(3):
        client.async_stream_infer("params_echo", _scalar_input(grpcclient),
                                  parameters={"n": n})
    got = [answers.get(timeout=30) for _ in range(3)]
    client.stop_stream()
    client.close()
    assert all(not isinstance(g, InferenceServerException) for g in got), got
    assert sorted(_params(g)["n"] for g in got) == [0, 1, 2]
    assert all({k: v for k, v in _params(g).items() if k != "n"} == FORWARDED for g in got)


def test_forwarded_headers_reach_the_composing_models_of_an_ensemble(
        server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([2.0], dtype=np.float32))
    result = client.infer("echo_after_identity", [x], headers=dict(HEADERS))
    assert _params(result) == FORWARDED


def test_a_pattern_that_does_not_compile_stops_the_server_with_its_reason(
        tmp_path: pathlib.Path) -> None:
    srv = ShoalServer([str(tmp_path)], ["--http-header-forward-pattern", "my_(header"])
    try:
        with pytest.raises(RuntimeError, match="shoal exited with 2"):
            srv.start(timeout=20)
        assert "invalid header forward pattern 'my_(header'" in srv.log()
    finally:
        srv.stop()
