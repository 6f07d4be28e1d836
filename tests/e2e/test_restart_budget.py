"""A model instance that keeps dying right after its start is not given up for good: past the
5 quick deaths in a row it shows UNAVAILABLE with the reason, but the broker goes on starting
it (at the capped back-off) and it serves again, READY, once its cause is gone, while
/v2/health/live stays 200 throughout (issue 26: a crash-looping model used to stay dead while
the server looked live, so nothing ever restarted it)."""

from __future__ import annotations

import os
import pathlib
import signal
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

# initialize records its pid, then dies at once unless the marker file exists
_MODEL = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(HERE, "attempts"), "a") as attempts:
            attempts.write(f"{os.getpid()}\\n")
        if not os.path.exists(os.path.join(HERE, "healthy")):
            os._exit(3)

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        return out
'''

_CONFIG = '''
name: "flaky"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''


@pytest.fixture
def flaky(tmp_path: pathlib.Path) -> Iterator[tuple[ShoalServer, pathlib.Path]]:
    model = tmp_path / "repo" / "flaky"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(_MODEL)
    (model / "config.pbtxt").write_text(_CONFIG)
    (model / "healthy").write_text("")
    with serving(ShoalServer([str(tmp_path / "repo")])) as srv:
        yield srv, model


def _attempts(model: pathlib.Path) -> list[int]:
    return [int(line) for line in (model / "attempts").read_text().split()]


def _ready(srv: ShoalServer) -> bool:
    return httpx.get(f"{srv.base}/v2/models/flaky/ready", timeout=10).status_code == 200


def _reason(srv: ShoalServer) -> str:
    index = httpx.post(f"{srv.base}/v2/repository/index", json={}, timeout=10).json()
    return next(str(entry.get("reason", "")) for entry in index if entry["name"] == "flaky")


def _wait(condition: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting until {condition}")


def test_crash_looping_instance_keeps_being_retried_and_recovers(
        flaky: tuple[ShoalServer, pathlib.Path]) -> None:
    srv, model = flaky
    assert _ready(srv)
    (model / "healthy").unlink()
    os.kill(_attempts(model)[-1], signal.SIGKILL)  # from now on every start dies at once

    # the 5th quick death in a row is where the instance used to be given up for good
    _wait("the instance died 5 times in a row", lambda: "times in a row" in _reason(srv), 90)
    assert not _ready(srv)
    assert httpx.get(f"{srv.base}/v2/health/live", timeout=10).status_code == 200
    given_up_at = len(_attempts(model))

    # it is started again after that (the old code never started it again) ...
    _wait("a start after the give-up", lambda: len(_attempts(model)) > given_up_at, 60)
    assert not _ready(srv)
    assert httpx.get(f"{srv.base}/v2/health/live", timeout=10).status_code == 200

    # ... and serves once the cause is gone
    (model / "healthy").write_text("")
    _wait("the model is ready again", lambda: _ready(srv), 90)
    answer = httpx.post(f"{srv.base}/v2/models/flaky/infer", timeout=10, json={
        "inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [41]}]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [42]
    assert _reason(srv) == ""
    assert "times in a row" in srv.log()  # each give-up is logged
