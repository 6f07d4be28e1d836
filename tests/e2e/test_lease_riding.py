"""Lease releases riding on messages sent anyway (issue #16 part 4): a frontend's releases travel
on its next InferRequestBatch, the broker holds an executing worker's releases for its next
Batch (broker/held_releases.py). Through a real server with small arenas (4 MiB segments,
16 MiB per process), these prove that every output's memory still comes back: after a
concurrent burst, while a decoupled model streams more than its arena holds, and after a worker
is killed while releases for it are held."""

from __future__ import annotations

import os
import pathlib
import queue
import signal
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

SMALL_ARENA = ["--shm-segment-byte-size=4194304", "--shm-arena-byte-size=16777216"]
MIB_FLOATS = 256 * 1024  # 1 MiB of FP32
# One output this large fits a worker's 16 MiB arena only if no 4 MiB segment still holds a
# slot: it succeeds only once every earlier output's lease was given back.
PROBE_FLOATS = 13 * MIB_FLOATS

# Sleeps DELAY seconds, then returns INPUT0.
ECHO_MODEL = """
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            delay = pb_utils.get_input_tensor_by_name(r, "DELAY").as_numpy()
            time.sleep(float(delay.reshape(-1)[0]))
            arr = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", arr.copy())]))
        return out
"""

# Decoupled: execute returns at once; a thread sends COUNT responses of INPUT0, 20 ms apart,
# then the final flag. The instance is idle (between batches) while it streams.
STREAM_MODEL = """
import threading
import time
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for r in requests:
            arr = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy().copy()
            count = int(pb_utils.get_input_tensor_by_name(r, "COUNT").as_numpy()[0])
            thread = threading.Thread(target=self.stream, args=(r.get_response_sender(), arr,
                                                                 count))
            thread.start()
            self.threads.append(thread)
        return None

    def stream(self, sender, arr, count):
        for _ in range(count):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", arr)]))
            time.sleep(0.02)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
"""


def _write(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())


def _echo(repo: pathlib.Path, name: str) -> None:
    _write(repo / name / "config.pbtxt", f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [
          {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
          {{ name: "DELAY" data_type: TYPE_FP32 dims: [ 1 ] }}
        ]
        output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}]
        instance_group [{{ kind: KIND_CPU count: 1 }}]
    """)
    _write(repo / name / "1" / "model.py", ECHO_MODEL)


def _stream(repo: pathlib.Path, name: str) -> None:
    _write(repo / name / "config.pbtxt", f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        model_transaction_policy {{ decoupled: true }}
        input [
          {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
          {{ name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }}
        ]
        output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}]
        instance_group [{{ kind: KIND_CPU count: 1 }}]
    """)
    _write(repo / name / "1" / "model.py", STREAM_MODEL)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("leases")
    _echo(repo, "echo")
    _echo(repo, "victim")
    _stream(repo, "stream")
    with serving(ShoalServer([str(repo)], SMALL_ARENA)) as srv:
        yield srv


def _echo_inputs(values: np.ndarray, delay: float) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values, binary_data=True)
    pause = httpclient.InferInput("DELAY", [1], "FP32")
    pause.set_data_from_numpy(np.array([delay], np.float32))
    return [tensor, pause]


def _echo_call(server: ShoalServer, model: str, values: np.ndarray, delay: float = 0.0
               ) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)  # one per thread
    try:
        out = client.infer(model, _echo_inputs(values, delay),
                           outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])
        result: np.ndarray = out.as_numpy("OUTPUT0")
        return result
    finally:
        client.close()


def _arena_comes_back(server: ShoalServer, model: str, timeout: float = 15.0) -> None:
    """The probe (13 of the worker's 16 MiB in one output) succeeds within ``timeout``: the
    releases of the last answers may still be on their way, nothing may stay leaked."""
    probe = np.arange(PROBE_FLOATS, dtype=np.float32)
    deadline = time.monotonic() + timeout
    while True:
        try:
            np.testing.assert_array_equal(_echo_call(server, model, probe), probe)
            return
        except InferenceServerException as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"{model}'s arena never came back: {exc}") from exc
            time.sleep(0.1)


def test_a_concurrent_burst_gives_all_its_output_memory_back(server: ShoalServer) -> None:
    # 4 clients x 20 requests of 1 MiB out each (80 MiB through a 16 MiB arena); the worker is
    # mostly executing when releases arrive, so they ride on its next Batch
    failures: list[str] = []

    def client_loop(seed: int) -> None:
        for i in range(20):
            values = np.full(MIB_FLOATS, seed * 100 + i, np.float32)
            try:
                got = _echo_call(server, "echo", values, 0.002)
                if not np.array_equal(got, values):
                    failures.append(f"client {seed} request {i}: wrong output")
            except InferenceServerException as exc:
                failures.append(f"client {seed} request {i}: {exc}")

    threads = [threading.Thread(target=client_loop, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert failures == []
    _arena_comes_back(server, "echo")


def test_a_decoupled_stream_larger_than_the_arena_is_served(server: ShoalServer) -> None:
    # 24 responses of 1 MiB from a thread of an instance that is idle meanwhile: each streamed
    # output's release must reach the worker while the stream runs, or the arena fills up
    values = np.arange(MIB_FLOATS, dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", [MIB_FLOATS], "FP32")
    tensor.set_data_from_numpy(values)
    count = grpcclient.InferInput("COUNT", [1], "INT32")
    count.set_data_from_numpy(np.array([24], np.int32))
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("stream", [tensor, count], request_id="big",
                                  enable_empty_final_response=True)
        received = [results.get(timeout=60) for _ in range(25)]
    finally:
        client.stop_stream()
        client.close()
    errors = [str(error) for _, error in received if error is not None]
    assert errors == []
    outputs = [result.as_numpy("OUTPUT0") for result, _ in received[:24]]
    assert all(np.array_equal(out, values) for out in outputs)
    final = received[24][0].get_response()
    assert final.parameters["triton_final_response"].bool_param and not final.outputs


def test_a_worker_killed_with_releases_held_for_it_wedges_nothing(server: ShoalServer) -> None:
    (pid,) = server.worker_pids("victim")
    values = np.arange(MIB_FLOATS, dtype=np.float32)
    outcome: dict[str, object] = {}

    def slow_call() -> None:
        try:
            _echo_call(server, "victim", values, 30.0)
            outcome["error"] = None
        except InferenceServerException as exc:
            outcome["error"] = str(exc)

    # The first answer is written while the slow request waits behind it; the slow one starts
    # when the first ends, so the first answer's release reaches the broker while the worker
    # executes the slow one: it is held for that worker's next Batch, which never comes.
    first = threading.Thread(target=lambda: outcome.update(
        first=_echo_call(server, "victim", values, 0.5)))
    slow = threading.Thread(target=slow_call)
    first.start()
    time.sleep(0.2)
    slow.start()
    first.join(timeout=30)
    np.testing.assert_array_equal(outcome["first"], values)  # type: ignore[arg-type]
    time.sleep(0.5)  # the first answer's release is held in the broker now
    os.kill(pid, signal.SIGKILL)
    slow.join(timeout=30)
    assert outcome.get("error"), "the request of the killed worker did not fail"
    # the broker goes on: other models serve at once, the victim once replaced
    np.testing.assert_array_equal(_echo_call(server, "echo", values), values)
    deadline = time.monotonic() + 60
    while server.worker_pids("victim") in ([], [pid]) or not _ready(server, "victim"):
        assert time.monotonic() < deadline, "the killed instance was not replaced"
        time.sleep(0.1)
    for _ in range(20):
        np.testing.assert_array_equal(_echo_call(server, "victim", values), values)
    _arena_comes_back(server, "victim")
    _arena_comes_back(server, "echo")


def _ready(server: ShoalServer, model: str) -> bool:
    client = httpclient.InferenceServerClient(server.url)
    try:
        return bool(client.is_model_ready(model))
    finally:
        client.close()
