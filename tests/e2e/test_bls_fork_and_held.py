"""BLS from a python model that keeps a large answer alive while it makes its next call (the
callee's arena would have no room left if the answer still held its memory), and BLS from
processes the model forks with ``multiprocessing`` (a fresh connection per child)."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

# 4 MiB segments, 16 MiB per process: a 16 MiB output fills the callee's arena.
SMALL_ARENA = ["--shm-segment-byte-size=4194304", "--shm-arena-byte-size=16777216"]

IDENT_CONFIG = """
name: "ident"
backend: "python"
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
"""

IDENT = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''

CALLER_CONFIG = """
name: "caller"
backend: "python"
input [{ name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] }]
output [{ name: "RESULT" data_type: TYPE_STRING dims: [ 1 ] }]
"""

CALLER = '''
import json
import multiprocessing

import numpy as np
import triton_python_backend_utils as pb_utils


def send(n):
    x = np.arange(n, dtype=np.float32)
    r = pb_utils.InferenceRequest(model_name="ident", inputs=[pb_utils.Tensor("INPUT0", x)],
                                  requested_output_names=["OUTPUT0"]).exec()
    if r.has_error():
        return r, "error: " + r.error().message()
    out = pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy()
    return r, "ok" if np.array_equal(out, x) else "wrong"


def child(q):
    q.put(send(1000)[1])


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for req in requests:
            mode = int(pb_utils.get_input_tensor_by_name(req, "MODE").as_numpy()[0])
            res = []
            if mode == 0:  # each answer is still alive while the next call is made
                r, s = send(4 * 1024 * 1024)
                res.append(s)
                for _ in range(2):
                    r, s = send(800 * 1024)
                    res.append(s)
            else:
                if mode == 2:
                    res.append(send(1000)[1])  # the parent's link exists before the fork
                ctx = multiprocessing.get_context("fork")
                q = ctx.Queue()
                procs = [ctx.Process(target=child, args=(q,)) for _ in range(2)]
                for p in procs:
                    p.start()
                for _ in procs:
                    try:
                        res.append(q.get(timeout=20))
                    except Exception:
                        res.append("timeout")
                for p in procs:
                    p.join(10)
                    if p.is_alive():
                        p.kill()
                        res.append("hung")
                res.append(send(1000)[1])  # the parent still works after its children
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "RESULT", np.array([json.dumps(res).encode()], dtype=np.object_))]))
        return out
'''


def _model(repo: pathlib.Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(code)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("bls_fork")
    _model(repo, "ident", IDENT_CONFIG, IDENT)
    _model(repo, "caller", CALLER_CONFIG, CALLER)
    with serving(ShoalServer([str(repo)], SMALL_ARENA)) as srv:
        yield srv


def _run(server: ShoalServer, mode: int) -> list[str]:
    client = httpclient.InferenceServerClient(server.url, network_timeout=120)
    tensor = httpclient.InferInput("MODE", [1], "INT32")
    tensor.set_data_from_numpy(np.array([mode], np.int32))
    outcome: list[str] = json.loads(client.infer("caller", [tensor]).as_numpy("RESULT")[0])
    return outcome


def test_a_held_answer_that_filled_the_callee_arena_leaves_room_for_the_next(
        server: ShoalServer) -> None:
    assert _run(server, 0) == ["ok", "ok", "ok"]
    assert _run(server, 0) == ["ok", "ok", "ok"]


@pytest.mark.parametrize("mode", [1, 2])
def test_forked_children_make_bls_calls(server: ShoalServer, mode: int) -> None:
    assert set(_run(server, mode)) == {"ok"}
