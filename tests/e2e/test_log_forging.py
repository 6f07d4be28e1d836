"""Client strings cannot forge log lines (issue #26 part 3): at --log-verbose 1 the frontend logs
refused requests with the model and input names a client chose; a newline, a carriage return or
an ANSI escape in them is written escaped, so no line of the log starts where the client wanted
it to."""

from __future__ import annotations

import pathlib
import time
import urllib.parse
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import serving
from tests.e2e.models import identity_model
from tests.e2e.server import ShoalServer

FORGED = "ERROR [broker pid 1] shoal.broker.loop: forged"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = pathlib.Path(tmp_path_factory.mktemp("forging"))
    identity_model(repo, "identity", "FP32")
    with serving(ShoalServer([str(repo)], ["--log-verbose=1"])) as srv:
        yield srv


def _forged_lines(server: ShoalServer) -> list[str]:
    return [line for line in server.log().splitlines() if line.startswith(FORGED)]


@pytest.mark.parametrize("separator", ["\n", "\r\n", "\x1b[2K\r"])
def test_a_model_name_in_the_path_cannot_start_a_line(server: ShoalServer,
                                                      separator: str) -> None:
    name = urllib.parse.quote(f"nosuch{separator}{FORGED}", safe="")
    r = httpx.post(f"{server.base}/v2/models/{name}/infer", json={"inputs": []})
    assert r.status_code == 404
    time.sleep(0.3)  # the debug line is written as the answer goes
    assert _forged_lines(server) == []
    assert "nosuch\\" in server.log()  # the line is there, escaped


def test_an_input_name_in_the_body_cannot_start_a_line(server: ShoalServer) -> None:
    r = httpx.post(f"{server.base}/v2/models/identity/infer", json={"inputs": [
        {"name": f"X\n{FORGED}", "datatype": "FP32", "shape": [1], "data": [1.0]}]})
    assert r.status_code == 400
    time.sleep(0.3)
    assert _forged_lines(server) == []
