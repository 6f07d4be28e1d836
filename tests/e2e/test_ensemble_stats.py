"""Ensemble statistics and ``ensemble_scheduling.max_inflight_requests`` through the real server.

Every ensemble here is the chain ``fast`` -> ``slow`` (each step adds 1). The step models count,
under a file lock, how many step requests they are executing at once and keep the maximum, so
the limit is measured from inside the composing models.
"""

from __future__ import annotations

import concurrent.futures
import json
import pathlib
import re
import socket
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.server import ShoalServer

SLOW_S = 0.3  # the slow step's execution; inputs >= 100 make it HOLD_S instead
HOLD_S = 1.0

STEP_MODEL = '''
import fcntl
import json
import os
import time

import triton_python_backend_utils as pb_utils

STATE_DIR = {state_dir!r}
DELAYS = {{"fast": 0.02, "slow": {slow}}}


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]
        self.path = os.path.join(STATE_DIR, self.name + ".json")

    def _count(self, delta):
        """Requests executing now across this model's instances, and the most ever."""
        with open(self.path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with open(self.path) as f:
                    state = json.load(f)
            except (FileNotFoundError, ValueError):
                state = {{"now": 0, "max": 0}}
            state["now"] += delta
            state["max"] = max(state["max"], state["now"])
            with open(self.path, "w") as f:
                json.dump(state, f)

    def execute(self, requests):
        self._count(len(requests))
        try:
            inputs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
            hold = self.name == "slow" and any((x >= 100).any() for x in inputs)
            time.sleep({hold} if hold else DELAYS[self.name])
            out = []
            for x in inputs:
                if (x < 0).any():
                    out.append(pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("negative input")))
                else:
                    out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
            return out
        finally:
            self._count(-len(requests))
'''


def step_config(name: str, instances: int) -> str:
    return textwrap.dedent(f'''
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [{{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }}]
        output [{{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }}]
        dynamic_batching {{ max_queue_delay_microseconds: 1000 }}
        instance_group [{{ count: {instances} kind: KIND_CPU }}]
    ''')


def ensemble_config(name: str, max_inflight: int) -> str:
    limit = f"max_inflight_requests: {max_inflight}" if max_inflight else ""
    return textwrap.dedent(f'''
        name: "{name}"
        platform: "ensemble"
        max_batch_size: 8
        input [{{ name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] }}]
        output [{{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] }}]
        ensemble_scheduling {{
          {limit}
          step [
            {{ model_name: "fast" model_version: -1
              input_map {{ key: "X" value: "INPUT" }} output_map {{ key: "Y" value: "mid" }} }},
            {{ model_name: "slow" model_version: -1
              input_map {{ key: "X" value: "mid" }} output_map {{ key: "Y" value: "OUTPUT" }} }}
          ]
        }}
    ''')


ENSEMBLES = {"stats_pipeline": 0, "unlimited": 0, "limited": 2, "limited_one": 1}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ShoalServer, pathlib.Path]]:
    repo = tmp_path_factory.mktemp("ensemble_stats")
    state = tmp_path_factory.mktemp("step_state")
    code = STEP_MODEL.format(state_dir=str(state), slow=SLOW_S, hold=HOLD_S)
    for name, instances in (("fast", 1), ("slow", 2)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(step_config(name, instances))
        (repo / name / "1" / "model.py").write_text(code)
    for name, limit in ENSEMBLES.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(ensemble_config(name, limit))
    server = ShoalServer([str(repo)]).start()
    try:
        yield server, state
    finally:
        assert server.stop() == 0


def http_infer(server: ShoalServer, model: str, x: np.ndarray) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.url)
    inp = httpclient.InferInput("INPUT", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    out: np.ndarray | None = client.infer(model, [inp]).as_numpy("OUTPUT")
    assert out is not None
    return out


def grpc_infer(server: ShoalServer, model: str, x: np.ndarray) -> np.ndarray:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("INPUT", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    out: np.ndarray | None = client.infer(model, [inp]).as_numpy("OUTPUT")
    assert out is not None
    return out


def http_stats(server: ShoalServer, model: str) -> dict[str, Any]:
    stats: dict[str, Any] = httpclient.InferenceServerClient(server.url).get_inference_statistics(
        model)["model_stats"][0]
    return stats


def counts(stats: dict[str, Any]) -> dict[str, int]:
    """The HTTP stats as flat integers: inference/execution counts, count and ns per duration."""
    flat = {"inference_count": int(stats["inference_count"]),
            "execution_count": int(stats["execution_count"]),
            "last_inference": int(stats["last_inference"])}
    for kind in ("success", "fail", "queue", "compute_input", "compute_infer",
                 "compute_output"):
        flat[f"{kind}.count"] = int(stats["inference_stats"][kind]["count"])
        flat[f"{kind}.ns"] = int(stats["inference_stats"][kind]["ns"])
    return flat


def grpc_counts(stats: Any) -> dict[str, int]:
    flat = {"inference_count": stats.inference_count, "execution_count": stats.execution_count,
            "last_inference": stats.last_inference}
    for kind in ("success", "fail", "queue", "compute_input", "compute_infer",
                 "compute_output"):
        duration = getattr(stats.inference_stats, kind)
        flat[f"{kind}.count"] = duration.count
        flat[f"{kind}.ns"] = duration.ns
    return flat


def reset_concurrency(state: pathlib.Path) -> None:
    for name in ("fast", "slow"):
        (state / f"{name}.json").write_text(json.dumps({"now": 0, "max": 0}))


def most_concurrent(state: pathlib.Path, name: str) -> int:
    recorded = json.loads((state / f"{name}.json").read_text())
    assert recorded["now"] == 0  # every execution has ended
    return int(recorded["max"])


def burst(server: ShoalServer, model: str, n: int) -> None:
    """``n`` concurrent one-row requests, half over HTTP and half over gRPC, each checked."""
    inputs = [np.full((1, 4), i, np.float32) for i in range(n)]

    def one(i: int) -> np.ndarray:
        infer = http_infer if i % 2 else grpc_infer
        return infer(server, model, inputs[i])

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(one, range(n)))
    for x, result in zip(inputs, results, strict=True):
        np.testing.assert_array_equal(result, x + 2)


# ------------------------------------------------------------------ statistics


def test_ensemble_statistics_over_http_and_grpc(setup: tuple[ShoalServer, pathlib.Path]) -> None:
    server, _ = setup
    composing_before = {m: counts(http_stats(server, m)) for m in ("fast", "slow")}
    for batch in (1, 2, 3):
        x = np.arange(4 * batch, dtype=np.float32).reshape(batch, 4)
        np.testing.assert_array_equal(http_infer(server, "stats_pipeline", x), x + 2)
    np.testing.assert_array_equal(
        grpc_infer(server, "stats_pipeline", np.ones((1, 4), np.float32)), np.full((1, 4), 3))
    with pytest.raises(InferenceServerException, match="negative input"):
        grpc_infer(server, "stats_pipeline", np.full((1, 4), -5, np.float32))

    stats = http_stats(server, "stats_pipeline")
    ensemble = counts(stats)
    assert ensemble["inference_count"] == 1 + 2 + 3 + 1  # rows of the successful requests
    assert ensemble["execution_count"] == 4  # one per successful request
    assert ensemble["success.count"] == 4 and ensemble["fail.count"] == 1
    assert ensemble["fail.ns"] > 0 and ensemble["last_inference"] > 0
    for kind in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert ensemble[f"{kind}.count"] == 4  # Triton counts these per successful request
    # compute: the sums over the composing requests, each at least its step's sleep
    assert ensemble["compute_infer.ns"] >= 4 * (0.02 + SLOW_S) * 1e9 * 0.9
    compute = sum(ensemble[f"compute_{k}.ns"] for k in ("input", "infer", "output"))
    assert ensemble["success.ns"] >= compute  # a chain: each request outlasts its steps
    assert ensemble["queue.ns"] < ensemble["success.ns"] // 100
    assert {int(b["batch_size"]): int(b["compute_infer"]["count"])
            for b in stats["batch_stats"]} == {1: 2, 2: 1, 3: 1}

    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    assert grpc_counts(grpc.get_inference_statistics("stats_pipeline").model_stats[0]) == ensemble

    after = {m: counts(http_stats(server, m)) for m in ("fast", "slow")}
    delta = {m: {k: after[m][k] - composing_before[m][k] for k in after[m]} for m in after}
    # the step that answered InferenceResponse(error=...) is a success of "fast" (Triton
    # counts a python model's error response so; the ensemble's request still failed)
    assert (delta["fast"]["success.count"], delta["fast"]["fail.count"]) == (5, 0)
    assert (delta["slow"]["success.count"], delta["slow"]["fail.count"]) == (4, 0)
    assert delta["slow"]["inference_count"] == 7


# ------------------------------------------------------------------ max_inflight_requests


def test_max_inflight_requests_bounds_concurrent_step_requests(
        setup: tuple[ShoalServer, pathlib.Path]) -> None:
    server, state = setup
    reset_concurrency(state)
    burst(server, "unlimited", 16)
    unlimited = most_concurrent(state, "slow")
    assert unlimited > 2, "without a limit the slow step should run more requests at once"

    reset_concurrency(state)
    burst(server, "limited", 16)  # max_inflight_requests: 2
    assert 1 <= most_concurrent(state, "slow") <= 2
    assert 1 <= most_concurrent(state, "fast") <= 2
    assert counts(http_stats(server, "limited"))["success.count"] == 16


def _raw_post(server: ShoalServer, model: str, x: np.ndarray) -> socket.socket:
    """Send an infer request on a raw socket and return it without reading the answer."""
    body = json.dumps({"inputs": [{"name": "INPUT", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.flatten().tolist()}]}).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port))
    sock.sendall(f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                 .encode() + body)
    return sock


def _canceled_failures(server: ShoalServer, model: str) -> int:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
    match = re.search(rf'nv_inference_request_failure{{model="{model}",reason="CANCELED",'
                      rf'version="1"}} (\d+)', text)
    assert match is not None
    return int(match.group(1))


def test_cancelled_waiting_requests_free_their_places(
        setup: tuple[ShoalServer, pathlib.Path]) -> None:
    server, state = setup
    slow_before = counts(http_stats(server, "slow"))["success.count"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        holder = pool.submit(http_infer, server, "limited_one", np.full((1, 4), 100, np.float32))
        time.sleep(0.15)  # its slow step holds the one slot for HOLD_S
        waiting = [_raw_post(server, "limited_one", np.full((1, 4), i, np.float32))
                   for i in (1, 2)]
        time.sleep(0.3)  # both wait for a slot now (at the slow step, or held at fast)
        for sock in waiting:
            sock.close()  # the clients go away
        np.testing.assert_array_equal(holder.result(timeout=30), np.full((1, 4), 102))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and counts(
            http_stats(server, "limited_one"))["fail.count"] < 2:
        time.sleep(0.05)
    ensemble = counts(http_stats(server, "limited_one"))
    assert (ensemble["success.count"], ensemble["fail.count"]) == (1, 2)
    assert _canceled_failures(server, "limited_one") == 2
    reset_concurrency(state)
    burst(server, "limited_one", 4)  # the cancelled requests left no slot taken
    assert most_concurrent(state, "slow") == 1
    slow_after = counts(http_stats(server, "slow"))["success.count"]
    assert slow_after - slow_before == 1 + 4, "a cancelled request still reached the slow step"
