"""BLS through the real server: a python model calling other models (python, TorchScript,
decoupled, an ensemble) with ``pb_utils.InferenceRequest(...).exec()`` / ``async_exec()``,
errors as responses, outputs as views of the callee's shared memory given back when dropped,
callee and caller crashes, and model control from a model in explicit mode."""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.bls_models import (
    ADD_SUB,
    build_bls_repository,
    build_control_repository,
)
from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

# Small arenas (4 MiB segments, 16 MiB per process): outputs that were never given back would
# exhaust them within a few calls.
SMALL_ARENA = ["--shm-segment-byte-size=4194304", "--shm-arena-byte-size=16777216"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = build_bls_repository(tmp_path_factory.mktemp("bls"))
    with serving(ShoalServer([str(repo)], SMALL_ARENA)) as srv:
        yield srv


def run(server: ShoalServer, op: str, protocol: str = "http", caller: str = "bls_caller",
        **args: Any) -> dict[str, Any]:
    """One scenario (method ``op`` of the caller model, with ``args``); its JSON outcome."""
    command = np.array([json.dumps({"op": op, "args": args}).encode()], dtype=np.object_)
    if protocol == "grpc":
        client: Any = grpcclient.InferenceServerClient(server.grpc_url)
        tensor: Any = grpcclient.InferInput("CMD", [1], "BYTES")
    else:
        client = httpclient.InferenceServerClient(server.url, network_timeout=60)
        tensor = httpclient.InferInput("CMD", [1], "BYTES")
    tensor.set_data_from_numpy(command)
    result = client.infer(caller, [tensor])
    outcome: dict[str, Any] = json.loads(result.as_numpy("RESULT")[0])
    return outcome


def fp32(*values: float) -> list[object]:
    return ["float32", list(values)]


def nap_inputs(delay: float, n: int = 1) -> dict[str, list[object]]:
    return {"DELAY": ["float32", [[delay]]], "N": ["int32", [[n]]]}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sync_bls_to_a_python_model(server: ShoalServer, protocol: str) -> None:
    outcome = run(server, "call", protocol, model="add_sub",
                  inputs={"INPUT0": fp32(1, 2, 3, 4), "INPUT1": fp32(1, 1, 1, 1)})
    assert outcome["out"] == {"OUTPUT0": [2, 3, 4, 5], "OUTPUT1": [0, 1, 2, 3]}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sync_bls_to_a_torchscript_model(server: ShoalServer, protocol: str) -> None:
    outcome = run(server, "call", protocol, model="scaled",
                  inputs={"INPUT__0": ["float32", [[1, 2, 3, 4], [0, 0, 0, 0]]]})
    assert outcome["out"] == {"OUTPUT__0": [[3, 5, 7, 9], [1, 1, 1, 1]]}


def test_bytes_tensors_both_ways(server: ShoalServer) -> None:
    words = ["a", "", "h\u00e9llo", "x" * 1000]
    outcome = run(server, "call", model="identity_bytes", inputs={"INPUT0": ["bytes", words]})
    assert outcome["out"] == {"OUTPUT0": words}


def test_outputs_are_views_of_the_callees_shared_memory(server: ShoalServer) -> None:
    outcome = run(server, "call", model="add_sub", outputs=["OUTPUT1"],
                  inputs={"INPUT0": fp32(1, 2, 3, 4), "INPUT1": fp32(4, 3, 2, 1)})
    assert outcome["out"] == {"OUTPUT1": [-3, -1, 1, 3]}  # only what was asked for
    assert outcome["owndata"] == [False]
    assert outcome["bases"] == ["SharedOutput"]  # the holder that keeps the lease


def test_dropped_outputs_give_their_memory_back(server: ShoalServer) -> None:
    # 40 calls with 2 MiB in and 2 MiB out each, through 16 MiB arenas
    assert run(server, "large", count=40, floats=512 * 1024) == {"done": 40}


def test_async_bls_calls_from_one_execute_run_concurrently(server: ShoalServer) -> None:
    nap = 0.6
    outcome = run(server, "gather", model="nap", inputs=nap_inputs(nap), count=4)
    assert [r["out"] for r in outcome["results"]] == [{"OUT": [[1.0]]}] * 4
    assert outcome["elapsed"] < 2 * nap, outcome["elapsed"]  # one after another: 4 naps


def test_decoupled_bls_streams_every_response(server: ShoalServer) -> None:
    outcome = run(server, "stream", model="repeat_decoupled",
                  inputs={"IN": ["int32", [3]], "DELAY": ["float32", [0.01]]})
    responses = outcome["responses"]
    assert [r["out"] for r in responses[:3]] == [{"OUT": [0]}, {"OUT": [1]}, {"OUT": [2]}]
    assert responses[3:] == [{"out": {}, "owndata": [], "bases": []}]  # the flags-only final
    failing = run(server, "stream", model="repeat_decoupled",
                  inputs={"IN": ["int32", [-1]], "DELAY": ["float32", [0.0]]})["responses"]
    assert failing[0]["out"] == {"OUT": [0]}
    assert failing[-1]["error"] == "negative count"


def test_decoupled_callee_needs_decoupled_exec(server: ShoalServer) -> None:
    outcome = run(server, "stream", model="repeat_decoupled", decoupled=False,
                  inputs={"IN": ["int32", [1]], "DELAY": ["float32", [0.0]]})
    assert "is using the decoupled" in outcome["error"]
    assert "decoupled=True" in outcome["error"]


def test_bls_to_an_ensemble(server: ShoalServer) -> None:
    outcome = run(server, "call", model="pipe", inputs={"A": fp32(1, 2, 3, 4)})
    assert outcome["out"] == {"SUM": [2, 4, 6, 8], "DIFF": [0, 0, 0, 0]}


def test_errors_come_back_as_responses(server: ShoalServer) -> None:
    unknown = run(server, "call", model="no_such_model", inputs={"X": fp32(1)})
    assert unknown["error"] == ("Model no_such_model - Error when running inference: Failed "
                                "for execute the inference request. Model 'no_such_model' is "
                                "not ready.")
    wrong_type = run(server, "call", model="add_sub",
                     inputs={"INPUT0": ["int32", [1, 2, 3, 4]], "INPUT1": fp32(1, 1, 1, 1)})
    assert "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects " \
           "'FP32'" in wrong_type["error"]
    missing = run(server, "call", model="add_sub", inputs={"INPUT0": fp32(1, 2, 3, 4)})
    assert "missing required input(s) ['INPUT1']" in missing["error"]
    wrong_shape = run(server, "call", model="add_sub",
                      inputs={"INPUT0": fp32(1, 2), "INPUT1": fp32(1, 2)})
    assert "unexpected shape for input 'INPUT0'" in wrong_shape["error"]
    raised = run(server, "call", model="raiser", inputs={"X": fp32(1)})
    assert "ValueError: boom from the callee" in raised["error"]
    assert raised["code"] == 1  # INTERNAL
    assert run(server, "call", model="add_sub", inputs={  # and the caller serves on
        "INPUT0": fp32(1, 1, 1, 1), "INPUT1": fp32(1, 1, 1, 1)})["out"]["OUTPUT0"] == [2] * 4


def test_timeout_cancels_the_call(server: ShoalServer) -> None:
    started = time.monotonic()
    outcome = run(server, "call", model="nap", inputs=nap_inputs(1.5), timeout=200_000)
    assert outcome["error"] == "Request timeout expired"
    assert time.monotonic() - started < 1.4
    _nap_direct(server, 1)  # queued behind the cancelled nap: the callee is idle again


def test_dynamically_batched_caller_serves_concurrent_clients(server: ShoalServer) -> None:
    def infer(i: int) -> np.ndarray:
        # tritonclient.http runs on gevent: a client belongs to the thread that made it.
        client = httpclient.InferenceServerClient(server.url)
        tensor = httpclient.InferInput("X", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.full((1, 4), i, np.float32))
        return client.infer("bls_batched", [tensor]).as_numpy("Y")  # type: ignore[no-any-return]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(infer, range(16)))
    for i, answer in enumerate(answers):
        np.testing.assert_array_equal(answer, np.full((1, 4), 2 * i + 1, np.float32))


def _wait_ready(server: ShoalServer, model: str, timeout: float = 30.0) -> None:
    client = httpclient.InferenceServerClient(server.url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if client.is_model_ready(model) and server.worker_pids(model):
                return
        except InferenceServerException:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{model} not ready again")


def _in_background(call: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


def test_callee_crash_is_an_error_response_and_the_caller_serves_on(
        server: ShoalServer) -> None:
    (callee,) = server.worker_pids("nap")
    thread, outcome = _in_background(
        lambda: run(server, "call", model="nap", inputs=nap_inputs(5.0)))
    time.sleep(1.0)  # the caller waits inside exec(), the callee sleeps
    os.kill(callee, signal.SIGKILL)
    thread.join(20)
    error = outcome["value"]["error"]
    assert "model 'nap'" in error and f"pid {callee}" in error
    _wait_ready(server, "nap")
    assert run(server, "call", model="nap", inputs=nap_inputs(0.0))["out"] == {"OUT": [[1.0]]}


def _nap_direct(server: ShoalServer, n: int) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    inputs = [httpclient.InferInput("DELAY", [1, 1], "FP32"),
              httpclient.InferInput("N", [1, 1], "INT32")]
    inputs[0].set_data_from_numpy(np.zeros((1, 1), np.float32))
    inputs[1].set_data_from_numpy(np.full((1, 1), n, np.int32))
    outputs = [httpclient.InferRequestedOutput("OUT", binary_data=True)]
    return client.infer("nap", inputs, outputs=outputs).as_numpy("OUT")  # type: ignore[no-any-return]


def test_caller_crash_leaves_the_callee_serving_with_its_memory(server: ShoalServer) -> None:
    (caller,) = server.worker_pids("bls_caller")
    big = 3 * 1024 * 1024  # 12 MiB of output: two of them never fit a 16 MiB arena
    thread, outcome = _in_background(
        lambda: run(server, "call", model="nap", inputs=nap_inputs(1.5, big)))
    time.sleep(0.5)
    direct, direct_outcome = _in_background(lambda: _nap_direct(server, 4))
    os.kill(caller, signal.SIGKILL)
    thread.join(20)
    direct.join(20)
    assert isinstance(outcome["error"], InferenceServerException)
    assert "bls_caller" in str(outcome["error"])
    assert direct_outcome["value"].shape == (1, 4)
    for _ in range(4):  # the answer nobody could take was given back
        assert _nap_direct(server, big).shape == (1, big)
    _wait_ready(server, "bls_caller")
    assert run(server, "call", model="nap", inputs=nap_inputs(0.0))["out"] == {"OUT": [[1.0]]}


def test_a_dead_callers_held_outputs_go_back_to_the_callee(server: ShoalServer) -> None:
    """The caller keeps 3 x 5 MiB of identity_big's outputs (15 of its 16 MiB arena) and is
    killed: the broker gives those leases back, so identity_big serves large outputs again."""
    floats = 5 * 1024 * 1024 // 4
    assert run(server, "keep", count=3, floats=floats) == {"kept": 3}
    (caller,) = server.worker_pids("bls_caller")
    os.kill(caller, signal.SIGKILL)
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    data = np.arange(floats, dtype=np.float32)
    for _ in range(3):
        tensor = httpclient.InferInput("INPUT0", [floats], "FP32")
        tensor.set_data_from_numpy(data)
        out = client.infer("identity_big", [tensor]).as_numpy("OUTPUT0")
        assert out is not None and out[-1] == floats - 1
    client.close()
    _wait_ready(server, "bls_caller")


def test_model_control_needs_explicit_mode(server: ShoalServer) -> None:
    outcome = run(server, "control", model="add_sub")
    assert outcome["raised"] == (
        "TritonModelException: Failed to load model: explicit model load / unload is not "
        "allowed if polling is enabled")


def test_model_control_from_a_model(tmp_path: pathlib.Path) -> None:
    repo = build_control_repository(tmp_path)
    args = ["--model-control-mode=explicit", "--load-model=bls_caller"]
    with serving(ShoalServer([str(repo)], args)) as srv:
        steps = run(srv, "control", model="add_sub")
        assert steps["ready_before"] is False
        assert steps["ready_after_load"] is True
        assert steps["call"]["out"]["OUTPUT0"] == [2, 3, 4, 5]
        assert steps["ready_after_unload"] is False
        config = json.dumps({
            "name": "made", "backend": "python", "max_batch_size": 0,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2]}]})
        source = ADD_SUB.replace('"INPUT1"', '"INPUT0"').replace(
            'pb_utils.Tensor("OUTPUT1", a - b)', "")
        made = run(srv, "load_files", model="made", config=config, source=source)
        assert made["out"] == {"OUTPUT0": [10, 12]}
        refused = run(srv, "load_refused", model="other")
        assert refused["raised"].startswith("Failed to load model: ")
