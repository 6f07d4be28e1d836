"""The rate limiter through the real server: two models sharing one global resource of count 1
never execute at the same time (each execution reports its start and end), with the limiter off
they do overlap, and resource configurations that could never run are refused at load."""

from __future__ import annotations

import concurrent.futures
import pathlib
import textwrap
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

# Sleeps X seconds per request and reports when its execution started and ended.
TIMED_MODEL = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        start = time.time()
        time.sleep(float(pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()[0]))
        end = time.time()
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("START", np.array([start], np.float64)),
            pb_utils.Tensor("END", np.array([end], np.float64))]) for _ in requests]
"""

SHARED = 'rate_limiter { resources [{ name: "SHARED" global: true count: 1 }] }'
LIMITED = ["--rate-limit=execution_count", "--rate-limit-resource=SHARED:1",
           "--rate-limit-resource=TURN:1", "--rate-limit-resource=SEQ:1",
           "--rate-limit-resource=SOLO:1", "--rate-limit-resource=X:1",
           "--exit-on-error=false", "--strict-readiness=false"]


def timed_model(repo: pathlib.Path, name: str, rate_limiter: str, scheduling: str = "") -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(TIMED_MODEL))
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [{{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }}]
        output [{{ name: "START" data_type: TYPE_FP64 dims: [ 1 ] }},
                {{ name: "END" data_type: TYPE_FP64 dims: [ 1 ] }}]
        instance_group [{{ kind: KIND_CPU count: 1 {rate_limiter} }}]
        {scheduling}
    """))


def pair_repo(repo: pathlib.Path) -> pathlib.Path:
    for name in ("left", "right"):
        timed_model(repo, name, SHARED)
    return repo


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = pair_repo(tmp_path_factory.mktemp("limited"))
    timed_model(repo, "greedy", 'rate_limiter { resources [{ name: "SOLO" count: 2 }] }')
    for name, priority in (("favoured", 1), ("second", 2)):
        timed_model(repo, name, 'rate_limiter { resources [{ name: "TURN" global: true count: 1 '
                    f'}}] priority: {priority} }}')
    for name in ("seq_left", "seq_right"):
        timed_model(repo, name, 'rate_limiter { resources [{ name: "SEQ" global: true count: 1 '
                    '}] }', "sequence_batching { }")
    timed_model(repo, "nameless", 'rate_limiter { resources [{ name: "" count: 1 }] }')
    timed_model(repo, "clash_global", 'rate_limiter { resources [{ name: "X" global: true '
                'count: 1 }] }')
    timed_model(repo, "clash_device", 'rate_limiter { resources [{ name: "X" count: 1 }] }')
    with serving(ShoalServer([str(repo)], LIMITED)) as srv:
        _settled_index(srv, ALL_MODELS)  # not strict: ready before the refused ones settle
        yield srv


@pytest.fixture(scope="module")
def unlimited_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    with serving(ShoalServer([str(pair_repo(tmp_path_factory.mktemp("unlimited")))])) as srv:
        yield srv


def executions(server: ShoalServer, per_model: int = 4, pair: tuple[str, str] = ("left", "right"),
               ) -> dict[str, list[tuple[float, float]]]:
    """``per_model`` concurrent requests to each model of ``pair`` (as "left" and "right"):
    their (start, end). Each request is a whole sequence (start and end) for sequence models."""
    body: dict[str, object] = {
        "inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [0.15]}]}
    sequence_ids = iter(range(1, 1000))

    def call(side: str) -> tuple[str, tuple[float, float]]:
        model = pair[0] if side == "left" else pair[1]
        parameters = {"sequence_id": next(sequence_ids), "sequence_start": True,
                      "sequence_end": True}
        request = {**body, "parameters": parameters} if model.startswith("seq_") else body
        r = httpx.post(f"{server.base}/v2/models/{model}/infer", json=request, timeout=60)
        assert r.status_code == 200, r.text
        outputs = {o["name"]: o["data"][0] for o in r.json()["outputs"]}
        return side, (outputs["START"], outputs["END"])

    models = ["left", "right"] * per_model
    with concurrent.futures.ThreadPoolExecutor(len(models)) as pool:
        results = list(pool.map(call, models))
    return {m: [span for name, span in results if name == m] for m in ("left", "right")}


def overlapping(spans: dict[str, list[tuple[float, float]]]) -> list[tuple[object, object]]:
    return [(a, b) for a in spans["left"] for b in spans["right"]
            if a[0] < b[1] and b[0] < a[1]]


def test_models_sharing_one_global_copy_never_execute_together(
        limited_server: ShoalServer) -> None:
    spans = executions(limited_server)
    assert not overlapping(spans), f"executions overlapped: {overlapping(spans)}"
    stats = [httpx.get(f"{limited_server.base}/v2/models/{m}/stats").json()["model_stats"][0]
             for m in ("left", "right")]
    assert all(s["execution_count"] == s["inference_stats"]["success"]["count"] == 4
               for s in stats)
    # the wait for the shared copy counts as queue time, as in Triton: 8 executions of 0.15 s
    # one after another wait 0.15 x (0 + 1 + ... + 7) = 4.2 s in all (each model alone: 1.8 s)
    queued_s = sum(s["inference_stats"]["queue"]["ns"] for s in stats) / 1e9
    assert queued_s > 3.0, queued_s


def test_sequence_models_sharing_one_global_copy_never_execute_together(
        limited_server: ShoalServer) -> None:
    spans = executions(limited_server, pair=("seq_left", "seq_right"))
    assert not overlapping(spans), f"executions overlapped: {overlapping(spans)}"


def test_without_the_limiter_the_same_models_overlap(unlimited_server: ShoalServer) -> None:
    spans = executions(unlimited_server)
    assert overlapping(spans), f"no execution of left overlapped one of right: {spans}"


ALL_MODELS = ["greedy", "nameless", "clash_global", "clash_device", "left", "right",
              "favoured", "second", "seq_left", "seq_right"]


def test_priority_two_gets_half_the_turns_of_priority_one(limited_server: ShoalServer) -> None:
    """Both models always have requests queued (4 clients each) and take turns on one copy of
    TURN: the one with the fewest executions x priority goes next, so favoured (1) runs twice
    for each run of second (2). (With equal priorities the ratio would be 1.)"""
    body = {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [0.05]}]}
    stop_at = time.monotonic() + 3.0

    def client(model: str) -> None:
        with httpx.Client(base_url=limited_server.base, timeout=60) as http:
            while time.monotonic() < stop_at:
                assert http.post(f"/v2/models/{model}/infer", json=body).status_code == 200

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for future in [pool.submit(client, m) for m in ("favoured", "second") * 4]:
            future.result()
    runs = {m: httpx.get(f"{limited_server.base}/v2/models/{m}/stats").json()["model_stats"][0]
            ["execution_count"] for m in ("favoured", "second")}
    assert runs["second"] >= 5, runs
    # a client slow to send its next request (a loaded machine) can leave favoured's queue
    # empty for a turn: hence a range, not exactly 2
    assert 1.5 <= runs["favoured"] / runs["second"] <= 2.5, runs


def _settled_index(server: ShoalServer, names: list[str]) -> dict[str, dict[str, str]]:
    deadline = time.monotonic() + 60
    while True:
        index = {e["name"]: e for e in httpx.post(f"{server.base}/v2/repository/index").json()}
        if all(index[n].get("state") in ("READY", "UNAVAILABLE") for n in names) \
                or time.monotonic() > deadline:
            return index
        time.sleep(0.2)


def test_bad_resource_configs_are_refused_at_load(limited_server: ShoalServer) -> None:
    index = _settled_index(limited_server, ALL_MODELS)
    assert index["left"]["state"] == index["right"]["state"] == "READY"
    assert index["greedy"]["state"] == "UNAVAILABLE"
    assert 'Resource count for "SOLO" is limited to 1 which will prevent scheduling of one or ' \
           "more model instances, the minimum required count is 2" in index["greedy"]["reason"]
    assert index["nameless"]["state"] == "UNAVAILABLE"
    assert "instance_group[0].rate_limiter.resources[0].name must not be empty" in \
           index["nameless"]["reason"]
    clash = [index[n] for n in ("clash_global", "clash_device")]
    refused = [e for e in clash if e["state"] == "UNAVAILABLE"]
    assert len(refused) == 1, clash  # whichever loaded second
    assert 'Resource "X" is present as both global and device-specific resource' in \
           refused[0]["reason"]
