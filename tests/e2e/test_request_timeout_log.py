"""A request's timeout reaches the broker and, at ``--log-verbose 1``, is logged as Triton's core
logs it (``Request timeout: <us>``; Triton's BLS QA checks the value a model passed that way):
an HTTP request with a ``timeout`` parameter and a BLS call with ``timeout=``."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

pytestmark = pytest.mark.e2e

IO = """
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

IDENTITY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""

CALLER = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for r in requests:
            call = pb_utils.InferenceRequest(
                model_name="identity", inputs=[pb_utils.get_input_tensor_by_name(r, "INPUT0")],
                requested_output_names=["OUTPUT0"], timeout=11000000000)
            answer = call.exec()
            answers.append(pb_utils.InferenceResponse(
                [pb_utils.get_output_tensor_by_name(answer, "OUTPUT0")]))
        return answers
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo: pathlib.Path = tmp_path_factory.mktemp("timeout_log")
    for name, code in (("identity", IDENTITY), ("caller", CALLER)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(f'backend: "python"\n{IO}')
        (repo / name / "1" / "model.py").write_text(code)
    with serving(ShoalServer([str(repo)], ["--log-verbose=1"])) as srv:
        yield srv


def _logged(server: ShoalServer, text: str, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in pathlib.Path(server.log_path).read_text(errors="replace"):
            return True
        time.sleep(0.05)
    return False


def _x() -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([3.0], dtype=np.float32))
    return [tensor]


def test_a_bls_call_s_timeout_is_logged_with_its_value(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    assert client.infer("caller", _x()).as_numpy("OUTPUT0").tolist() == [3.0]
    assert _logged(server, "Request timeout: 11000000000")


def test_an_http_request_s_timeout_is_logged_with_its_value(server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    assert client.infer("identity", _x(), timeout=987654321).as_numpy("OUTPUT0").tolist() \
        == [3.0]
    assert _logged(server, "Request timeout: 987654321")
