"""A parent's death never cuts or hangs a stream (issue 26 part 4).

- The supervisor SIGKILLed: its children drain as on SIGTERM. Open decoupled streams (gRPC
  ModelStreamInfer, HTTP generate_stream) and unary requests receive every response, then the
  children exit and leave nothing in /dev/shm.
- The broker SIGKILLed: every open stream and unary request ends at once with an error naming
  the broker (not at --exit-timeout-secs), then the server stops with exit code 1 and every
  process exits, a worker in the middle of a long execute included.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import queue
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.models import sleepy_model
from tests.e2e.server import ShoalServer, instance_files, instance_of

# Decoupled: for N, sends N responses OUT = 0..N-1, DELAY seconds apart, from a thread of its
# own (execute returns at once, as Triton's decoupled examples do), then the final flag.
TRICKLE_MODEL = """
import threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            delay = float(pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()[0])
            threading.Thread(target=self.trickle, args=(request.get_response_sender(), n, delay),
                             daemon=True).start()
        return None

    def trickle(self, sender, n, delay):
        for i in range(n):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT",
                                                                    np.array([i], np.int32))]))
            time.sleep(delay)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
TRICKLE_CONFIG = """
name: "trickle"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "N" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "DELAY" data_type: TYPE_FP32 dims: [ 1 ] }
]
output [{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }]
"""
EXIT_TIMEOUT_S = 60  # far beyond what any test here waits: an end at the timeout fails it


@pytest.fixture
def repo(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "trickle" / "1").mkdir(parents=True)
    (tmp_path / "trickle" / "config.pbtxt").write_text(TRICKLE_CONFIG)
    (tmp_path / "trickle" / "1" / "model.py").write_text(TRICKLE_MODEL)
    sleepy_model(tmp_path, "sleepy")
    return tmp_path


def _wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


class GrpcStream:
    """One gRPC ModelStreamInfer call carrying ``count`` trickle requests."""

    def __init__(self, server: ShoalServer, count: int, n: int, delay: float) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.messages: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.outs: dict[str, list[int]] = {str(i): [] for i in range(count)}
        self.finals: set[str] = set()
        self.errors: list[str] = []
        self.client.start_stream(callback=lambda result, error: self.messages.put((result, error)))
        for i in range(count):
            inputs = [grpcclient.InferInput("N", [1], "INT32"),
                      grpcclient.InferInput("DELAY", [1], "FP32")]
            inputs[0].set_data_from_numpy(np.array([n], np.int32))
            inputs[1].set_data_from_numpy(np.array([delay], np.float32))
            self.client.async_stream_infer("trickle", inputs, request_id=str(i),
                                           enable_empty_final_response=True)

    def collect(self, until: Callable[[], bool], timeout: float) -> None:
        """Take messages until ``until()`` holds or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while not until() and time.monotonic() < deadline:
            try:
                result, error = self.messages.get(timeout=0.05)
            except queue.Empty:
                continue
            if error is not None:
                self.errors.append(str(error))
                continue
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                self.finals.add(response.id)
            if response.outputs:
                self.outs[response.id].append(int(result.as_numpy("OUT")[0]))

    def started(self) -> bool:
        return all(self.outs.values())

    def complete(self) -> bool:
        return self.finals == set(self.outs)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.stop_stream()
        self.client.close()


class HttpCall(threading.Thread):
    """One HTTP request in a thread: ``generate_stream`` events or a unary answer."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.status = 0
        self.events: list[dict[str, Any]] = []
        self.text = ""
        self.failure = ""
        self.ended_at = 0.0

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url, json=self.body, timeout=120) as response:
                self.status = response.status_code
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(json.loads(line[len("data: "):]))
                    self.text += line
        except Exception as exc:  # recorded, asserted by the test
            self.failure = repr(exc)
        self.ended_at = time.monotonic()


def _http_connections(server: ShoalServer) -> int:
    """Established connections the frontends hold on the server's HTTP port."""
    count = 0
    for pid in server.frontend_pids():
        with contextlib.suppress(psutil.NoSuchProcess):
            count += sum(1 for c in psutil.Process(pid).net_connections(kind="tcp")
                         if c.laddr and c.laddr.port == server.http_port
                         and c.status == psutil.CONN_ESTABLISHED)
    return count


def _role(children: list[psutil.Process], module: str) -> list[psutil.Process]:
    return [c for c in children if f"-m {module} " in " ".join(c.cmdline())]


def _sleepy_body(delay: float) -> dict[str, Any]:
    return {"inputs": [{"name": "DELAY", "shape": [1], "datatype": "FP32", "data": [delay]}]}


def test_supervisor_killed_streams_and_requests_finish_then_all_exits_clean(
    repo: pathlib.Path, fresh_server_factory: list[ShoalServer]
) -> None:
    server = ShoalServer([str(repo)], [f"--exit-timeout-secs={EXIT_TIMEOUT_S}"]).start()
    fresh_server_factory.append(server)
    assert server.process is not None
    children = server.children()  # broker, frontend, workers
    instance_id = instance_of(children)
    stream = GrpcStream(server, count=2, n=20, delay=0.1)
    http_stream = HttpCall(f"{server.base}/v2/models/trickle/generate_stream",
                           {"N": 20, "DELAY": 0.1})
    unary = HttpCall(f"{server.base}/v2/models/sleepy/infer", _sleepy_body(1.5))
    try:
        http_stream.start()
        unary.start()
        stream.collect(stream.started, 30)
        assert stream.started() and not stream.errors, stream.errors
        assert _wait_for(lambda: bool(http_stream.events), 30), http_stream.failure
        # the unary request's connection is the frontend's (a request still connecting when the
        # supervisor dies is refused: the frontends close their ports at once, by design)
        assert _wait_for(lambda: _http_connections(server) >= 2, 30)
        time.sleep(0.3)  # and its request read

        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait(timeout=10)

        stream.collect(stream.complete, 30)
        http_stream.join(timeout=30)
        unary.join(timeout=30)
        assert not stream.errors, stream.errors
        assert stream.outs == {"0": list(range(20)), "1": list(range(20))}
        assert stream.complete()
        assert http_stream.failure == "" and http_stream.status == 200, http_stream.failure
        assert [e.get("OUT") for e in http_stream.events] == list(range(20)), http_stream.events
        assert unary.status == 200, (unary.text, unary.failure)
        assert json.loads(unary.text)["outputs"][0]["data"] == [1.5]
        stream.close()
        # then every child exits and the last one out leaves nothing behind
        assert _wait_for(lambda: not any(p.is_running() for p in children), 30), \
            [" ".join(p.cmdline())[:80] for p in children if p.is_running()]
        assert _wait_for(lambda: not instance_files(instance_id), 5), \
            instance_files(instance_id)
        assert not os.path.exists(os.path.join(tempfile.gettempdir(), f"shoal-{instance_id}"))
    finally:
        stream.close()
        for child in children:  # orphans: no fixture would stop them
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()


def test_broker_killed_every_open_stream_and_request_ends_at_once_naming_the_broker(
    repo: pathlib.Path, fresh_server_factory: list[ShoalServer]
) -> None:
    server = ShoalServer([str(repo)], [f"--exit-timeout-secs={EXIT_TIMEOUT_S}"]).start()
    fresh_server_factory.append(server)
    assert server.process is not None
    children = server.children()
    instance_id = instance_of(children)
    (broker,) = _role(children, "shoal.broker")
    stream = GrpcStream(server, count=2, n=400, delay=0.1)  # 40 s each, were it left alone
    http_stream = HttpCall(f"{server.base}/v2/models/trickle/generate_stream",
                           {"N": 400, "DELAY": 0.1})
    unary = HttpCall(f"{server.base}/v2/models/sleepy/infer", _sleepy_body(40.0))
    grpc_unary: dict[str, Any] = {}

    def call_grpc_unary() -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        inp = grpcclient.InferInput("DELAY", [1], "FP32")
        inp.set_data_from_numpy(np.array([40.0], np.float32))
        try:
            client.infer("sleepy", [inp], client_timeout=120)
            grpc_unary["error"] = "answered"
        except Exception as exc:  # recorded, asserted by the test
            grpc_unary["error"] = exc
        grpc_unary["ended_at"] = time.monotonic()
        client.close()

    grpc_thread = threading.Thread(target=call_grpc_unary, daemon=True)
    try:
        http_stream.start()
        unary.start()
        grpc_thread.start()
        stream.collect(stream.started, 30)
        assert stream.started() and not stream.errors, stream.errors
        assert _wait_for(lambda: bool(http_stream.events), 30), http_stream.failure
        time.sleep(0.5)  # the unary requests reach the broker

        broker.kill()
        killed_at = time.monotonic()
        stream.collect(lambda: len(stream.errors) == 2, 10)
        http_stream.join(timeout=10)
        unary.join(timeout=10)
        grpc_thread.join(timeout=10)
        # every one ended long before the exit timeout, with an error naming the broker
        assert len(stream.errors) == 2 and all("broker exited" in e for e in stream.errors), \
            stream.errors
        assert not stream.complete()
        assert not http_stream.is_alive() and http_stream.failure == "", http_stream.failure
        assert "broker exited" in http_stream.events[-1].get("error", ""), http_stream.events
        assert not unary.is_alive() and unary.status == 503, (unary.status, unary.text)
        assert "broker exited" in json.loads(unary.text)["error"]
        error = grpc_unary.get("error")
        assert getattr(error, "status", lambda: None)() == "StatusCode.UNAVAILABLE", error
        assert "broker exited" in str(error)
        for ended in (http_stream.ended_at, unary.ended_at, grpc_unary["ended_at"]):
            assert ended - killed_at < EXIT_TIMEOUT_S / 6
        stream.close()
        # the dead broker still stops the whole server, exit 1, leaving nothing behind
        assert server.process.wait(timeout=30) == 1
        assert "the broker process exited unexpectedly" in server.log()
        assert _wait_for(lambda: not any(p.is_running() for p in children), 30)
        assert _wait_for(lambda: not instance_files(instance_id), 5), \
            instance_files(instance_id)
    finally:
        stream.close()
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
