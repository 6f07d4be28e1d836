"""``import c_python_backend_utils`` (the name of Triton's compiled stub module, which some
models import directly) works in a python model: the same classes as pb_utils, and
``shared_memory.free_memory()`` reading the worker's output arena (what it can still take)."""

from __future__ import annotations

import pathlib
import textwrap
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

ARENA_BYTES = 64 * 1024 * 1024

MODEL = '''
import numpy as np
import c_python_backend_utils as c_utils
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        same = c_utils.Tensor is pb_utils.Tensor and c_utils.Logger is pb_utils.Logger
        free = c_utils.shared_memory.free_memory()
        out = np.array([free, int(same)], np.int64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]) for _ in requests]
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = pathlib.Path(tmp_path_factory.mktemp("c_utils"))
    (repo / "free" / "1").mkdir(parents=True)
    (repo / "free" / "1" / "model.py").write_text(MODEL)
    (repo / "free" / "config.pbtxt").write_text(textwrap.dedent('''
        backend: "python"
        max_batch_size: 0
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT64 dims: [ 2 ] } ]
    '''))
    with serving(ShoalServer([str(repo)], [f"--shm-arena-byte-size={ARENA_BYTES}"])) as srv:
        yield srv


def test_free_memory_reads_the_worker_s_arena_and_the_classes_are_pb_utils_s(
        server: ShoalServer) -> None:
    answers = []
    for _ in range(2):
        r = httpx.post(f"{server.base}/v2/models/free/infer", timeout=30, json={
            "inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}]})
        assert r.status_code == 200, r.text
        answers.append(r.json()["outputs"][0]["data"])
    (free, same), again = answers
    assert same == 1
    assert 0 < free <= ARENA_BYTES
    assert again == answers[0]  # the first answer's memory was given back before the second
