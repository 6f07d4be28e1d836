"""The rate limiter through the real server, once: two python models sharing one global
resource of count 1 (given by --rate-limit-resource) never execute at the same time, as each
execution reports its start and end. The limiter's other behaviours (no limiter: overlap;
sequences; priorities; refused configs) are the broker's alone and run in process
(tests/broker/test_rate_limiter_in_process.py)."""

from __future__ import annotations

import concurrent.futures
import pathlib
import textwrap
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
LIMITED = ["--rate-limit=execution_count", "--rate-limit-resource=SHARED:1"]


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
    with serving(ShoalServer([str(pair_repo(tmp_path_factory.mktemp("limited")))],
                             LIMITED)) as srv:
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
