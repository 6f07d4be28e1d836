"""``triton_grpc_error: true`` on a ModelStreamInfer stream (Triton's opt-in, which Triton's QA
lifecycle test uses): the first error ends the stream with the error's gRPC status and text
instead of travelling in-band; without the header errors stay in-band and the stream goes on.
tritonclient's streaming API against a real server and a python model that fails on negative
input."""

from __future__ import annotations

import pathlib
import queue
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

pytestmark = pytest.mark.e2e

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if value[0] < 0:
                answers.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative input")))
            else:
                answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
        return answers
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo: pathlib.Path = tmp_path_factory.mktemp("grpc_error_header")
    (repo / "fails_on_negative" / "1").mkdir(parents=True)
    (repo / "fails_on_negative" / "config.pbtxt").write_text(CONFIG)
    (repo / "fails_on_negative" / "1" / "model.py").write_text(MODEL)
    with serving(ShoalServer([str(repo)])) as srv:
        yield srv


def _input(value: float) -> list[Any]:
    tensor = grpcclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.float32))
    return [tensor]


def _stream(server: ShoalServer, headers: dict[str, str] | None
            ) -> tuple[grpcclient.InferenceServerClient, queue.Queue[Any]]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result),
                        headers=headers)
    return client, answers


def test_with_the_header_a_model_error_ends_the_stream_with_its_status(
        server: ShoalServer) -> None:
    client, answers = _stream(server, {"triton_grpc_error": "true"})
    client.async_stream_infer("fails_on_negative", _input(1.0))
    first = answers.get(timeout=30)
    assert not isinstance(first, InferenceServerException), first
    assert first.as_numpy("OUT").tolist() == [1.0]
    client.async_stream_infer("fails_on_negative", _input(-1.0))
    ended = answers.get(timeout=30)
    assert isinstance(ended, InferenceServerException)
    assert ended.status() == str(grpc.StatusCode.INTERNAL)
    assert "negative input" in ended.message()
    with pytest.raises(InferenceServerException):  # the stream is over
        client.async_stream_infer("fails_on_negative", _input(2.0))
    client.stop_stream()
    client.close()


def test_with_the_header_a_refused_request_ends_the_stream_with_its_status(
        server: ShoalServer) -> None:
    client, answers = _stream(server, {"triton_grpc_error": "true"})
    client.async_stream_infer("no_such_model", _input(1.0))
    ended = answers.get(timeout=30)
    assert isinstance(ended, InferenceServerException)
    assert ended.status() == str(grpc.StatusCode.NOT_FOUND)
    client.stop_stream()
    client.close()


def test_without_the_header_errors_stay_in_band_and_the_stream_goes_on(
        server: ShoalServer) -> None:
    client, answers = _stream(server, None)
    for value in (-1.0, 3.0, -2.0, 4.0):
        client.async_stream_infer("fails_on_negative", _input(value))
    got = [answers.get(timeout=30) for _ in range(4)]
    client.stop_stream()
    client.close()
    assert [isinstance(g, InferenceServerException) for g in got] == [True, False, True, False]
    assert all("negative input" in g.message() for g in got[0::2])
    assert [g.as_numpy("OUT").tolist() for g in got[1::2]] == [[3.0], [4.0]]
