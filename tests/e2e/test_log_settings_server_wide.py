"""The logging extension's settings hold server-wide, as in Triton: ``POST /v2/logging`` (or gRPC
``LogSettings``) on the frontend also sets the level of the workers, where a python model's
``pb_utils.Logger`` writes, and of workers that start afterwards. A real server, its log file,
and a python model that logs one INFO and one VERBOSE line per request, each tagged."""

from __future__ import annotations

import os
import pathlib
import signal
import time
import uuid
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

pytestmark = pytest.mark.e2e

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "TAG" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            tag = pb_utils.get_input_tensor_by_name(request, "TAG").as_numpy()
            text = tag[0].decode()
            pb_utils.Logger.log_info(f"info line {text}")
            pb_utils.Logger.log_verbose(f"verbose line {text}")
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", tag)]))
        return answers
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo: pathlib.Path = tmp_path_factory.mktemp("log_settings")
    (repo / "logs_lines" / "1").mkdir(parents=True)
    (repo / "logs_lines" / "config.pbtxt").write_text(CONFIG)
    (repo / "logs_lines" / "1" / "model.py").write_text(MODEL)
    with serving(ShoalServer([str(repo)])) as srv:
        yield srv


def _log_lines(server: ShoalServer) -> tuple[str, str]:
    """Infer once with a fresh tag: the tag, and the INFO line the model logs for it."""
    tag = uuid.uuid4().hex
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("TAG", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([tag.encode()], dtype=object))
    client.infer("logs_lines", [tensor])
    return tag, f"info line {tag}"


def _full_log(server: ShoalServer) -> str:
    return pathlib.Path(server.log_path).read_text(errors="replace")


def _wait_for(server: ShoalServer, text: str, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in _full_log(server):
            return True
        time.sleep(0.05)
    return False


def test_verbose_set_on_the_frontend_reaches_the_model_s_worker(server: ShoalServer) -> None:
    tag, info = _log_lines(server)
    assert _wait_for(server, info)
    assert f"verbose line {tag}" not in _full_log(server)  # verbose 0 at start
    reply = httpx.post(f"{server.base}/v2/logging", json={"log_verbose_level": 1}, timeout=10)
    assert reply.status_code == 200 and reply.json()["log_verbose_level"] == 1
    tag, _ = _log_lines(server)
    assert _wait_for(server, f"verbose line {tag}")
    httpx.post(f"{server.base}/v2/logging", json={"log_verbose_level": 0}, timeout=10)


def test_info_turned_off_over_grpc_silences_the_model(server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.update_log_settings({"log_info": False})
    try:
        _, info = _log_lines(server)
        client.update_log_settings({"log_info": True})
        _, marker_info = _log_lines(server)  # logged after it: the earlier one was not
        assert _wait_for(server, marker_info)
        assert info not in _full_log(server)
    finally:
        client.update_log_settings({"log_info": True})
        client.close()


def test_a_worker_started_after_the_change_follows_it(server: ShoalServer) -> None:
    httpx.post(f"{server.base}/v2/logging", json={"log_verbose_level": 1}, timeout=10)
    try:
        old = set(server.worker_pids("logs_lines"))
        for pid in old:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pids = set(server.worker_pids("logs_lines"))
            if pids and not pids & old:
                try:
                    tag, _ = _log_lines(server)
                    break
                except Exception:
                    pass
            time.sleep(0.2)
        else:
            pytest.fail("the worker was not replaced")
        assert _wait_for(server, f"verbose line {tag}")
    finally:
        httpx.post(f"{server.base}/v2/logging", json={"log_verbose_level": 0}, timeout=10)
