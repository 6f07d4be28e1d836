"""Implicit sequence state (``sequence_batching.state``) end to end: the server carries each
sequence's state from one request to the next (the model never stores it), initial state from
zeros or from a data_file, variable dims, both strategies, and a worker death that loses no
state because the state lives in broker-owned shared memory."""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import signal
import textwrap
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.server import ShoalServer

pytestmark = pytest.mark.e2e

# The accumulator of Triton's implicit-state docs: the model reads the running sum from the
# state input and returns the new sum as the state output; it keeps nothing itself.
# VALUE == -1 sleeps first (a request a test can kill the worker under).
ACCUMULATE = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "SUM_IN").as_numpy()
            if int(value.ravel()[0]) == -1:
                time.sleep(3)
            total = (state + value).astype(np.int64)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", total), pb_utils.Tensor("SUM_OUT", total)]))
        return responses
'''

# Appends each value to a history of variable length (a state with a -1 dim).
HISTORY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            past = pb_utils.get_input_tensor_by_name(request, "HIST_IN").as_numpy()
            history = value if int(start.ravel()[0]) else np.concatenate([past, value], axis=1)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("HISTORY", history), pb_utils.Tensor("HIST_OUT", history)]))
        return responses
'''


def accumulate_config(name: str, strategy: str = "", initial: str = "",
                      slots: int = 2, idle_us: int = 20000000) -> str:
    initial_state = (f'initial_state: {{ name: "start_value" data_type: TYPE_INT64 dims: [ 1 ] '
                     f'{initial} }}' if initial else "")
    return textwrap.dedent(f'''
        name: "{name}"
        backend: "python"
        max_batch_size: {slots}
        sequence_batching {{
          max_sequence_idle_microseconds: {idle_us}
          {strategy}
          state [{{ input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_INT64
                    dims: [ 1 ] {initial_state} }}]
        }}
        input [{{ name: "VALUE" data_type: TYPE_INT64 dims: [ 1 ] }}]
        output [{{ name: "SUM" data_type: TYPE_INT64 dims: [ 1 ] }}]
        instance_group [{{ kind: KIND_CPU count: 1 }}]
    ''')


HISTORY_CONFIG = textwrap.dedent('''
    name: "history"
    backend: "python"
    max_batch_size: 2
    parameters { key: "shoal_state_buffer_bytes" value: { string_value: "32" } }
    sequence_batching {
      control_input [
        { name: "START" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }] }
      ]
      state [{ input_name: "HIST_IN" output_name: "HIST_OUT" data_type: TYPE_INT64
               dims: [ -1 ] }]
    }
    input [{ name: "VALUE" data_type: TYPE_INT64 dims: [ 1 ] }]
    output [{ name: "HISTORY" data_type: TYPE_INT64 dims: [ -1 ] }]
''')


def _add_model(repo: pathlib.Path, name: str, config: str, code: str) -> pathlib.Path:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(code)
    return repo / name


@pytest.fixture(scope="module")
def state_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("state")
    _add_model(repo, "accumulate", accumulate_config(
        "accumulate", "direct { max_queue_delay_microseconds: 5000 "
        "minimum_slot_utilization: 1.0 }"), ACCUMULATE)
    _add_model(repo, "accumulate_oldest", accumulate_config(
        "accumulate_oldest", "oldest { max_candidate_sequences: 4 "
        "max_queue_delay_microseconds: 5000 }", slots=4), ACCUMULATE)
    seeded = _add_model(repo, "accumulate_seeded", accumulate_config(
        "accumulate_seeded", initial='data_file: "start.bin"'), ACCUMULATE)
    (seeded / "initial_state").mkdir()
    (seeded / "initial_state" / "start.bin").write_bytes(np.array([1000], np.int64).tobytes())
    _add_model(repo, "history", HISTORY_CONFIG, HISTORY)
    _add_model(repo, "accumulate_brief", accumulate_config("accumulate_brief", idle_us=400000),
               ACCUMULATE)
    server = ShoalServer([str(repo)]).start()
    try:
        yield server
    finally:
        assert server.stop() == 0


def _http_step(url: str, model: str) -> Callable[[int, int, bool, bool], int]:
    client = httpclient.InferenceServerClient(url)

    def step(seq: int, value: int, start: bool, end: bool) -> int:
        value_input = httpclient.InferInput("VALUE", [1, 1], "INT64")
        value_input.set_data_from_numpy(np.array([[value]], np.int64))
        result = client.infer(model, [value_input], sequence_id=seq, sequence_start=start,
                              sequence_end=end)
        return int(result.as_numpy("SUM")[0, 0])

    return step


def _run_sequences(url: str, model: str, sequences: list[int], values: list[int]
                   ) -> dict[int, list[int]]:
    def run(seq: int) -> list[int]:
        step = _http_step(url, model)
        return [step(seq, v * seq, i == 0, i == len(values) - 1) for i, v in enumerate(values)]

    with concurrent.futures.ThreadPoolExecutor(len(sequences)) as pool:
        return dict(zip(sequences, pool.map(run, sequences), strict=True))


@pytest.mark.parametrize("model", ["accumulate", "accumulate_oldest"])
def test_state_carries_each_sequence_exactly(state_server: ShoalServer, model: str) -> None:
    values = [3, 1, 4, 1, 5, 9]
    sequences = list(range(11, 17))  # 6 sequences; the direct model has 2 slots: backlog
    sums = _run_sequences(state_server.url, model, sequences, values)
    for seq, got in sums.items():
        assert got == list(np.cumsum([v * seq for v in values])), (model, seq, got)
    stats = httpclient.InferenceServerClient(state_server.url).get_inference_statistics(
        model)["model_stats"][0]
    assert max(b["batch_size"] for b in stats["batch_stats"]) > 1, "never batched sequences"


def test_a_new_sequence_starts_from_zero_state(state_server: ShoalServer) -> None:
    step = _http_step(state_server.url, "accumulate")
    assert [step(41, v, i == 0, i == 2) for i, v in enumerate([5, 6, 7])] == [5, 11, 18]
    # the same id again: a new incarnation, its state starts from zeros again
    assert [step(41, v, i == 0, i == 1) for i, v in enumerate([1, 2])] == [1, 3]


def test_a_second_start_on_a_live_id_begins_a_fresh_state(state_server: ShoalServer) -> None:
    step = _http_step(state_server.url, "accumulate")
    assert step(71, 5, True, False) == 5
    assert step(71, 3, False, False) == 8
    assert step(71, 2, True, False) == 2  # Triton: the live sequence ends, a new one starts
    assert step(71, 1, False, True) == 3


def test_idle_sequence_is_released_and_its_state_dropped(state_server: ShoalServer) -> None:
    step = _http_step(state_server.url, "accumulate_brief")
    assert step(81, 5, True, False) == 5
    assert step(81, 4, False, False) == 9
    time.sleep(1.5)  # max_sequence_idle_microseconds is 0.4 s
    with pytest.raises(InferenceServerException, match="START"):
        step(81, 1, False, False)
    assert step(81, 1, True, True) == 1  # a new sequence on the id starts from zeros


def test_initial_state_from_data_file(state_server: ShoalServer) -> None:
    step = _http_step(state_server.url, "accumulate_seeded")
    assert [step(7, v, i == 0, i == 2) for i, v in enumerate([1, 2, 3])] == [1001, 1003, 1006]


def test_state_over_grpc(state_server: ShoalServer) -> None:
    client = grpcclient.InferenceServerClient(f"localhost:{state_server.grpc_port}")
    totals = []
    for i, v in enumerate([10, 20, 30]):
        value_input = grpcclient.InferInput("VALUE", [1, 1], "INT64")
        value_input.set_data_from_numpy(np.array([[v]], np.int64))
        result = client.infer("accumulate", [value_input], sequence_id="session-a",
                              sequence_start=i == 0, sequence_end=i == 2)
        totals.append(int(result.as_numpy("SUM")[0, 0]))
    assert totals == [10, 30, 60]


def test_state_outputs_are_not_returned_to_clients(state_server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(state_server.url)
    value_input = httpclient.InferInput("VALUE", [1, 1], "INT64")
    value_input.set_data_from_numpy(np.array([[4]], np.int64))
    result = client.infer("accumulate", [value_input], sequence_id=99, sequence_start=True,
                          sequence_end=True)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["SUM"]


def _history_step(client: httpclient.InferenceServerClient, seq: int, value: int,
                  start: bool) -> list[int]:
    value_input = httpclient.InferInput("VALUE", [1, 1], "INT64")
    value_input.set_data_from_numpy(np.array([[value]], np.int64))
    result = client.infer("history", [value_input], sequence_id=seq, sequence_start=start)
    return [int(x) for x in result.as_numpy("HISTORY")[0]]


def test_variable_dims_state_grows_up_to_its_buffer(state_server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(state_server.url)
    assert _history_step(client, 5, 1, True) == [1]
    assert _history_step(client, 5, 2, False) == [1, 2]
    assert _history_step(client, 5, 3, False) == [1, 2, 3]
    assert _history_step(client, 5, 4, False) == [1, 2, 3, 4]
    # a fifth int64 does not fit the 32-byte state buffer: a clear error, state kept as it was
    with pytest.raises(InferenceServerException, match="shoal_state_buffer_bytes"):
        _history_step(client, 5, 5, False)
    assert _history_step(client, 5, 9, True) == [9]  # a new sequence on the same id
    assert client.is_server_live()


def _wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except Exception:
            pass
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_worker_death_loses_no_state(tmp_path: pathlib.Path,
                                     fresh_server_factory: list[ShoalServer]) -> None:
    """Two live sequences; the worker is SIGKILLed while running a request of the first. That
    request fails; after the restart both sequences continue from their states, the failed
    request's value not counted."""
    _add_model(tmp_path, "accumulate", accumulate_config("accumulate"), ACCUMULATE)
    server = ShoalServer([str(tmp_path)]).start()
    fresh_server_factory.append(server)
    step = _http_step(server.url, "accumulate")
    assert step(61, 5, True, False) == 5
    assert step(62, 7, True, False) == 7
    (pid,) = server.worker_pids("accumulate")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        doomed = pool.submit(  # sleeps 3 s in the model; a client of its own thread (gevent)
            lambda: _http_step(server.url, "accumulate")(61, -1, False, False))
        time.sleep(1.0)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(InferenceServerException, match="accumulate"):
            doomed.result(timeout=30)
    client = httpclient.InferenceServerClient(server.url)
    assert _wait_for(lambda: client.is_model_ready("accumulate")
                     and server.worker_pids("accumulate") not in ([], [pid]), 60)
    assert step(61, 10, False, False) == 15
    assert step(62, 1, False, True) == 8
    assert step(61, 1, False, True) == 16
    assert server.stop() == 0
