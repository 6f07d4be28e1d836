"""A python model's BYTES output of objects without a string form of their own is refused with
a clear error (issue #26 part 5: their default text is a heap address); numbers and strings go
out as their text, as Triton's python backend sends them."""

from __future__ import annotations

import pathlib
import textwrap
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            kind = pb_utils.get_input_tensor_by_name(request, "KIND").as_numpy()[0]
            items = [object()] if kind == 0 else [7, 2.5, "text"]
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", np.array(items, dtype=np.object_))]))
        return out
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = pathlib.Path(tmp_path_factory.mktemp("objects"))
    (repo / "objects" / "1").mkdir(parents=True)
    (repo / "objects" / "1" / "model.py").write_text(MODEL)
    (repo / "objects" / "config.pbtxt").write_text(textwrap.dedent("""
        backend: "python"
        max_batch_size: 0
        input [ { name: "KIND" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] } ]
    """))
    with serving(ShoalServer([str(repo)])) as srv:
        yield srv


def _infer(server: ShoalServer, kind: int) -> httpx.Response:
    return httpx.post(f"{server.base}/v2/models/objects/infer", timeout=30, json={
        "inputs": [{"name": "KIND", "datatype": "INT32", "shape": [1], "data": [kind]}]})


def test_an_object_without_a_string_form_is_an_error_and_leaks_no_address(
        server: ShoalServer) -> None:
    r = _infer(server, 0)
    assert r.status_code == 500
    assert "no string form of its own" in r.json()["error"]
    assert "0x" not in r.text


def test_numbers_and_strings_go_out_as_their_text(server: ShoalServer) -> None:
    r = _infer(server, 1)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == ["7", "2.5", "text"]
