"""An ensemble whose composing model fails to load, on a server started with
``--exit-on-error=false``: the ensemble is not ready, inference on it fails with Triton's
UNAVAILABLE answer (HTTP 503, gRPC UNAVAILABLE) naming the ensemble, nothing of it runs, and the
server stays live while a healthy ensemble in the same repository keeps serving.

Repository: ``good_step`` (x + 1), ``broken_step`` (raises in ``initialize``),
``good_pipeline`` = good_step -> good_step and ``broken_pipeline`` = good_step -> broken_step
(its first step is healthy, so the reason must name the step that is not)."""

from __future__ import annotations

import pathlib
import textwrap
import time
from collections.abc import Callable, Iterator

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.server import ShoalServer

pytestmark = pytest.mark.e2e

STEP_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        {initialize}

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        return responses
"""

STEP_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [{{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }}]
output [{{ name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }}]
"""

ENSEMBLE_CONFIG = """
name: "{name}"
platform: "ensemble"
max_batch_size: 4
input [{{ name: "INPUT" data_type: TYPE_FP32 dims: [ 2 ] }}]
output [{{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 2 ] }}]
ensemble_scheduling {{ step [
  {{ model_name: "good_step" model_version: -1
     input_map {{ key: "X" value: "INPUT" }} output_map {{ key: "Y" value: "middle" }} }},
  {{ model_name: "{second}" model_version: -1
     input_map {{ key: "X" value: "middle" }} output_map {{ key: "Y" value: "OUTPUT" }} }}
] }}
"""

LOAD_ERROR = "weights are missing"


def _write_model(repo: pathlib.Path, name: str, config: str, code: str | None = None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
    if code is not None:
        (repo / name / "1" / "model.py").write_text(code)


def build_repository(repo: pathlib.Path) -> pathlib.Path:
    _write_model(repo, "good_step", STEP_CONFIG.format(name="good_step"),
                 STEP_MODEL.format(initialize="pass"))
    _write_model(repo, "broken_step", STEP_CONFIG.format(name="broken_step"),
                 STEP_MODEL.format(initialize=f"raise RuntimeError('{LOAD_ERROR}')"))
    _write_model(repo, "good_pipeline",
                 ENSEMBLE_CONFIG.format(name="good_pipeline", second="good_step"))
    _write_model(repo, "broken_pipeline",
                 ENSEMBLE_CONFIG.format(name="broken_pipeline", second="broken_step"))
    return repo


def _wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except (OSError, httpx.HTTPError, InferenceServerException):  # not up yet
            pass
        time.sleep(0.1)
    return False


def _index(client: httpclient.InferenceServerClient) -> dict[str, dict[str, str]]:
    return {m["name"]: m for m in client.get_model_repository_index()}


@pytest.fixture(scope="module")
def tolerant_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    """The server up, every load settled: good models READY, broken_step UNAVAILABLE."""
    repo = build_repository(tmp_path_factory.mktemp("ensemble_not_ready"))
    server = ShoalServer([str(repo)], ["--exit-on-error=false"])
    server.start(wait_ready=False)  # strict readiness: the server as a whole never gets ready
    try:
        client = httpclient.InferenceServerClient(server.url)
        settled = _wait_for(lambda: client.is_model_ready("good_pipeline") and _index(client)[
            "broken_step"]["state"] == "UNAVAILABLE", 90)
        assert settled, f"models did not settle:\n{server.log()}"
        yield server
    finally:
        log = server.log()
        try:
            code = server.stop()
        except Exception:
            server.kill_tree()
            raise
        assert code == 0, log


def _body(values: list[float]) -> dict[str, object]:
    return {"inputs": [{"name": "INPUT", "shape": [1, 2], "datatype": "FP32", "data": values}]}


def _step_inferences(server: ShoalServer, model: str) -> int:
    stats = httpclient.InferenceServerClient(server.url).get_inference_statistics(model)
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


def test_broken_ensemble_is_not_ready_and_says_why(tolerant_server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(tolerant_server.url)
    assert not client.is_model_ready("broken_pipeline")
    ready = httpx.get(f"{tolerant_server.base}/v2/models/broken_pipeline/ready")
    assert ready.status_code != 200
    assert 400 <= ready.status_code < 600
    index = _index(client)
    assert index["broken_pipeline"]["state"] == "UNAVAILABLE"
    # the reason names the composing model at fault, not the healthy first step
    assert "broken_step" in index["broken_pipeline"].get("reason", "")
    assert "good_step" not in index["broken_pipeline"].get("reason", "")
    assert LOAD_ERROR in index["broken_step"].get("reason", "")
    assert index["good_pipeline"]["state"] == "READY"
    # strict readiness: the server is live but not ready while one model is unavailable
    assert client.is_server_live()
    assert httpx.get(f"{tolerant_server.base}/v2/health/ready").status_code != 200


def test_http_inference_on_broken_ensemble_is_not_found(tolerant_server: ShoalServer) -> None:
    first_step_before = _step_inferences(tolerant_server, "good_step")
    answer = httpx.post(f"{tolerant_server.base}/v2/models/broken_pipeline/infer",
                        json=_body([1.0, 2.0]), timeout=30)
    assert answer.status_code == 404  # Triton: a model with no ready version is NOT_FOUND
    error = answer.json()["error"]
    assert error == "Request for unknown model: 'broken_pipeline' has no available versions"
    # the client library raises with the same message
    client = httpclient.InferenceServerClient(tolerant_server.url)
    inp = httpclient.InferInput("INPUT", [1, 2], "FP32")
    inp.set_data_from_numpy(np.ones((1, 2), np.float32))
    with pytest.raises(InferenceServerException, match="broken_pipeline"):
        client.infer("broken_pipeline", [inp])
    # refused up front: its healthy first step did not run
    assert _step_inferences(tolerant_server, "good_step") == first_step_before


def test_http_healthy_ensemble_still_serves(tolerant_server: ShoalServer) -> None:
    answer = httpx.post(f"{tolerant_server.base}/v2/models/good_pipeline/infer",
                        json=_body([1.0, 2.0]), timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [3.0, 4.0]  # (x + 1) + 1
    client = httpclient.InferenceServerClient(tolerant_server.url)
    assert client.is_model_ready("good_pipeline")
    assert client.is_server_live()


def test_grpc_broken_ensemble_is_not_found(tolerant_server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(tolerant_server.grpc_url)
    assert client.is_server_live()
    assert not client.is_server_ready()
    assert not client.is_model_ready("broken_pipeline")
    first_step_before = _step_inferences(tolerant_server, "good_step")
    inp = grpcclient.InferInput("INPUT", [1, 2], "FP32")
    inp.set_data_from_numpy(np.ones((1, 2), np.float32))
    with pytest.raises(InferenceServerException) as raised:
        client.infer("broken_pipeline", [inp], client_timeout=30)
    assert raised.value.status() == str(grpc.StatusCode.NOT_FOUND)  # Triton: no ready version
    assert raised.value.message() == ("Request for unknown model: 'broken_pipeline' has no "
                                      "available versions")
    assert _step_inferences(tolerant_server, "good_step") == first_step_before
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["broken_pipeline"].state == "UNAVAILABLE"
    assert "broken_step" in index["broken_pipeline"].reason


def test_grpc_healthy_ensemble_still_serves(tolerant_server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(tolerant_server.grpc_url)
    assert client.is_model_ready("good_pipeline")
    inp = grpcclient.InferInput("INPUT", [1, 2], "FP32")
    inp.set_data_from_numpy(np.array([[5.0, -1.0]], np.float32))
    result = client.infer("good_pipeline", [inp], client_timeout=30)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT"), [[7.0, 1.0]])
    assert client.is_server_live()
