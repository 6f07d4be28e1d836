"""Triton's generate extension on a real server: ``/generate`` (one JSON object) and
``/generate_stream`` (Server-Sent Events), for plain and decoupled python models."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import pytest

from tests.e2e.server import ShoalServer


def post(server: ShoalServer, model: str, route: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.base}/v2/models/{model}/{route}", json=body, timeout=30)


def events(response: httpx.Response) -> list[Any]:
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    chunks = response.content.split(b"\n\n")
    assert chunks[-1] == b"" and all(c.startswith(b"data: ") for c in chunks[:-1])
    return [json.loads(chunk[len(b"data: "):]) for chunk in chunks[:-1]]


def test_generate_with_inputs_as_keys(server: ShoalServer) -> None:
    r = post(server, "add_sub", "generate",
             {"id": "g1", "INPUT0": [1, 2, 3, 4], "parameters": {"INPUT1": [1, 1, 1, 1],
                                                                 "temperature": 0.5}})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == {"id": "g1", "model_name": "add_sub", "model_version": "1",
                        "OUTPUT0": [2.0, 3.0, 4.0, 5.0], "OUTPUT1": [0.0, 1.0, 2.0, 3.0]}


def test_one_element_outputs_are_scalars(server: ShoalServer) -> None:
    r = post(server, "sleepy", "versions/1/generate", {"DELAY": 0.0})
    assert r.status_code == 200
    body = r.json()
    assert body["DELAY_OUT"] == 0.0 and isinstance(body["PID"], int)


def test_generate_errors_match_infer(server: ShoalServer) -> None:
    r = post(server, "add_sub", "generate", {"INPUT0": [1, 2, 3, 4]})
    infer = post(server, "add_sub", "infer", {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]})
    assert r.status_code == infer.status_code == 400
    assert r.json() == infer.json()
    r = post(server, "add_sub", "generate_stream",
             {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "triton_x": True})
    assert r.status_code == 400 and "reserved for Triton usage" in r.json()["error"]
    r = post(server, "nope", "generate", {})
    assert r.status_code == 404
    assert r.json()["error"] == "Request for unknown model: 'nope' is not found"


def test_generate_stream_of_a_decoupled_model(server: ShoalServer) -> None:
    r = post(server, "repeat_decoupled", "generate_stream", {"IN": 3, "DELAY": 0.01})
    assert r.status_code == 200
    assert events(r) == [{"model_name": "repeat_decoupled", "model_version": "1", "OUT": i}
                         for i in range(3)]


def test_generate_stream_of_a_plain_model_is_one_event(server: ShoalServer) -> None:
    r = post(server, "add_sub", "generate_stream", {"INPUT0": [0, 0, 0, 0],
                                                    "INPUT1": [1, 1, 1, 1]})
    (event,) = events(r)
    assert event["OUTPUT1"] == [-1.0, -1.0, -1.0, -1.0]


def test_an_error_after_the_first_event_is_an_error_event(server: ShoalServer) -> None:
    r = post(server, "repeat_decoupled", "generate_stream", {"IN": -1, "DELAY": 0.0})
    assert r.status_code == 200
    assert events(r) == [{"model_name": "repeat_decoupled", "model_version": "1", "OUT": 0},
                         {"error": "negative count"}]


@pytest.mark.parametrize("count,status", [(1, 200), (3, 501)])
def test_generate_takes_exactly_one_decoupled_response(server: ShoalServer, count: int,
                                                       status: int) -> None:
    r = post(server, "repeat_decoupled", "generate", {"IN": count, "DELAY": 0.0})
    assert r.status_code == status
    if status == 200:
        assert r.json() == {"model_name": "repeat_decoupled", "model_version": "1", "OUT": 0}
    else:  # Triton's text (it answers it with 200; shoal with 501)
        assert r.json()["error"] == ("generate expects model to produce exactly 1 response, "
                                     "use generate stream for model that generates various "
                                     "number of responses")


def test_a_client_leaving_the_stream_cancels_the_request(server: ShoalServer) -> None:
    body = json.dumps({"IN": 60, "DELAY": 0.1}).encode()  # 6 s of responses if not cancelled
    sock = socket.create_connection(("127.0.0.1", server.http_port))
    sock.sendall(b"POST /v2/models/repeat_decoupled/generate_stream HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while b"data: " not in received:
        received += sock.recv(4096)
    sock.close()  # gone after the first event
    started = time.monotonic()
    r = post(server, "repeat_decoupled", "generate", {"IN": 1, "DELAY": 0.0})
    assert r.status_code == 200
    assert time.monotonic() - started < 3.0, "the abandoned request kept the model busy"
