"""Iterative sequences (``sequence_batching { iterative_sequence: true }``) end to end: a python
model releases requests with ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` and each runs again,
in batches that mix requests at different iterations, until the model answers it; a decoupled
one streams a response per iteration; no sequence id is needed. A model that reschedules
without being iterative, or answers a request it rescheduled, gets Triton's errors, and the
server keeps serving."""

from __future__ import annotations

import concurrent.futures
import pathlib
import queue
import textwrap
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

# Runs each request STEPS times (its progress kept under its request id), sleeping a little
# per execute so that requests arriving meanwhile join the next batch; answers the number of
# executions it took and the largest batch it was part of.
STEPPING_MODEL = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.progress = {}

    def execute(self, requests):
        time.sleep(0.05)
        responses = []
        for request in requests:
            steps = int(pb_utils.get_input_tensor_by_name(request, "STEPS").as_numpy().flat[0])
            done, widest = self.progress.get(request.request_id(), (0, 0))
            done, widest = done + 1, max(widest, len(requests))
            if done < steps:
                self.progress[request.request_id()] = (done, widest)
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
                continue
            self.progress.pop(request.request_id(), None)
            out = np.array([[done, widest]], np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("RUNS", out)]))
        return responses
'''

# Decoupled: input N; sends N-1, N-2, ..., 0, one response per execution, FINAL with the last.
COUNTDOWN_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.left = {}

    def execute(self, requests):
        for request in requests:
            key = request.request_id()
            if key not in self.left:
                self.left[key] = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            self.left[key] -= 1
            out = pb_utils.InferenceResponse(
                [pb_utils.Tensor("LEFT", np.array([self.left[key]], np.int32))])
            sender = request.get_response_sender()
            if self.left[key] <= 0:
                del self.left[key]
                sender.send(out, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(out)
        return None
'''

# Reschedules and answers anyway (iterative), or reschedules without being iterative.
RESCHEDULE_AND_ANSWER_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            value = pb_utils.get_input_tensor_by_name(request, "STEPS").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("RUNS", value)]))
        return responses
'''

RESCHEDULE_ONLY_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
        return [None] * len(requests)
'''


def _model(repo: pathlib.Path, name: str, source: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(source)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))


STEPS_IO = '''
    input [ { name: "STEPS" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "RUNS" data_type: TYPE_INT32 dims: [ -1 ] } ]
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = pathlib.Path(tmp_path_factory.mktemp("iterative"))
    _model(repo, "stepping", STEPPING_MODEL, '''
        backend: "python"
        max_batch_size: 4
        input [ { name: "STEPS" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "RUNS" data_type: TYPE_INT32 dims: [ 2 ] } ]
        sequence_batching { iterative_sequence: true }
        instance_group [ { count: 1 kind: KIND_CPU } ]
    ''')
    _model(repo, "countdown", COUNTDOWN_MODEL, '''
        backend: "python"
        max_batch_size: 0
        input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "LEFT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        sequence_batching { iterative_sequence: true }
        model_transaction_policy { decoupled: true }
        instance_group [ { count: 1 kind: KIND_CPU } ]
    ''')
    _model(repo, "answers_rescheduled", RESCHEDULE_AND_ANSWER_MODEL, f'''
        backend: "python"
        max_batch_size: 0
        {STEPS_IO}
        sequence_batching {{ iterative_sequence: true }}
    ''')
    _model(repo, "not_iterative", RESCHEDULE_ONLY_MODEL, f'''
        backend: "python"
        max_batch_size: 0
        {STEPS_IO}
    ''')
    with serving(ShoalServer([str(repo)])) as srv:
        yield srv


def _infer(server: ShoalServer, model: str, steps: int, request_id: str,
           shape: tuple[int, ...] = (1, 1)) -> httpx.Response:
    return httpx.post(f"{server.base}/v2/models/{model}/infer", timeout=60, json={
        "id": request_id,
        "inputs": [{"name": "STEPS", "datatype": "INT32", "shape": shape, "data": [steps]}]})


def test_each_request_runs_until_the_model_answers_it_in_batches_shared_with_others(
        server: ShoalServer) -> None:
    steps = [3, 1, 4, 2, 5, 3, 1, 2]
    with concurrent.futures.ThreadPoolExecutor(len(steps)) as pool:
        answers = list(pool.map(lambda i: _infer(server, "stepping", steps[i], f"r{i}"),
                                range(len(steps))))
    runs = []
    for answer in answers:
        assert answer.status_code == 200, answer.text
        runs.append(answer.json()["outputs"][0]["data"])
    assert [done for done, _ in runs] == steps  # each ran exactly as often as it asked
    assert all(widest <= 4 for _, widest in runs)  # max_batch_size holds
    assert max(widest for _, widest in runs) > 1  # a rescheduled request shared a batch


def test_a_decoupled_model_streams_a_response_per_iteration_without_a_sequence_id(
        server: ShoalServer) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        n = grpcclient.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([4], np.int32))
        client.async_stream_infer("countdown", [n], request_id="c1")
        got = []
        for _ in range(4):
            item = answers.get(timeout=30)
            assert not isinstance(item, Exception), item
            got.append(int(item.as_numpy("LEFT")[0]))
        client.stop_stream()
    assert got == [3, 2, 1, 0]


def test_an_answer_for_a_rescheduled_request_is_triton_s_error(server: ShoalServer) -> None:
    answer = _infer(server, "answers_rescheduled", 1, "a1", (1,))
    assert answer.status_code == 500, answer.text
    assert ("Expected a None object in the execute function return list for reschduled "
            "request") in answer.json()["error"]


def test_rescheduling_a_model_that_is_not_iterative_fails_that_request(
        server: ShoalServer) -> None:
    answer = _infer(server, "not_iterative", 1, "n1", (1,))
    assert answer.status_code == 400, answer.text
    assert "iterative_sequence" in answer.json()["error"]
    assert _infer(server, "stepping", 2, "after").status_code == 200  # still serving
