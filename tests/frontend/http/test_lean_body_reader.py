"""The lean transport reads a slot-bound body (large binary request) straight into its arena
slot (``body_reader.BodyReader``): the bytes that came with the headers go through the parser,
the rest never does. Checked here on a real uvicorn + GuardedHttpProtocol (FakeDataPlane):
exact bodies however they are cut, pipelined requests after such a body, the body timeout and
its progress, and the slot given back."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import numpy as np
import pytest

from shoal.frontend.http.guard import HttpLimits
from shoal.frontend.http.lean import BODY_SLOT_MIN_BYTES, LeanInferCycle
from shoal.settings import settings_from_flags
from tests.frontend.http.test_lean import (
    LIMIT,
    Served,
    _read_answers,
    binary_request,
    serve,
)

BODY_TIMEOUT = 1.0
SHORT = HttpLimits(header_timeout_s=5.0, body_timeout_s=BODY_TIMEOUT, idle_timeout_s=5.0,
                   max_body_bytes=LIMIT, max_connections=16, over_cap=1)
INFER = "/v2/models/identity/infer"


def _large_request(array: np.ndarray[Any, Any], close: bool = False) -> tuple[bytes, bytes]:
    """(head, body) of a binary infer request whose body goes into a slot."""
    body, header_length = binary_request(array)
    head = (f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            f"Inference-Header-Content-Length: {header_length}\r\n"
            f"{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n").encode()
    return head, body


def _small_request(value: float, extra: str = "") -> bytes:
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1],
                                   "data": [value]}]}).encode()
    return (f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            f"{extra}\r\n").encode() + body


def _answer_array(body: bytes) -> np.ndarray[Any, Any]:
    header = json.loads(body[:body.index(b"}]}") + 3])
    size = header["outputs"][0]["parameters"]["binary_data_size"]
    return np.frombuffer(body[len(body) - size:], np.float32)


@pytest.fixture
def fed_bytes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Sizes of the body pieces the parser handed to lean cycles (the server runs in this
    process, in a thread)."""
    sizes: list[int] = []
    feed = LeanInferCycle.feed

    def counting(self: LeanInferCycle, body: bytes) -> None:
        sizes.append(len(body))
        feed(self, body)

    monkeypatch.setattr(LeanInferCycle, "feed", counting)
    return sizes


def test_a_body_sent_in_pieces_is_read_into_the_slot_not_through_the_parser(
        fed_bytes: list[int]) -> None:
    array = np.random.default_rng(1).standard_normal(BODY_SLOT_MIN_BYTES, dtype=np.float32)
    head, body = _large_request(array)
    with serve() as served, \
            socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(head + body[:1000])
        time.sleep(0.2)
        for start in range(1000, len(body), 1 << 20):  # later pieces in separate reads
            sock.sendall(body[start:start + (1 << 20)])
            time.sleep(0.02)
        ((status, answer),) = _read_answers(sock, 1)
        assert status == b"HTTP/1.1 200 OK"
        np.testing.assert_array_equal(_answer_array(answer), array)
        served.wait_clean()
        assert served.dataplane.allocations >= 1
    assert 0 < sum(fed_bytes) <= 1000, "the body after the headers' read went through the parser"


def test_requests_pipelined_after_a_large_body_are_answered_in_order() -> None:
    arrays = [np.random.default_rng(seed).standard_normal(BODY_SLOT_MIN_BYTES // 2 + seed,
                                                          dtype=np.float32)
              for seed in (2, 3)]
    first, second = (b"".join(_large_request(array)) for array in arrays)
    with serve() as served, \
            socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(first + _small_request(1.0) + second + _small_request(2.0))
        answers = _read_answers(sock, 4)
        assert [status for status, _ in answers] == [b"HTTP/1.1 200 OK"] * 4
        np.testing.assert_array_equal(_answer_array(answers[0][1]), arrays[0])
        np.testing.assert_array_equal(_answer_array(answers[2][1]), arrays[1])
        assert json.loads(answers[1][1])["outputs"][0]["data"] == [1.0]
        assert json.loads(answers[3][1])["outputs"][0]["data"] == [2.0]
        served.wait_clean()


def _read_to_eof(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_large_body_that_stops_gets_408_and_its_slot_back() -> None:
    head, body = _large_request(np.zeros(BODY_SLOT_MIN_BYTES, dtype=np.float32))
    with serve(SHORT) as served, \
            socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(head + body[:100])
        time.sleep(0.1)
        sock.sendall(body[100:len(body) // 2])  # read by the slot reader, then nothing
        start = time.monotonic()
        answer = _read_to_eof(sock)
        waited = time.monotonic() - start
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:100]
        assert waited < BODY_TIMEOUT + 5  # generous: the machine may be busy
        served.wait_clean()
        assert served.dataplane.requests == []


def test_a_large_body_that_keeps_moving_outlasts_the_body_timeout() -> None:
    array = np.random.default_rng(4).standard_normal(BODY_SLOT_MIN_BYTES, dtype=np.float32)
    head, body = _large_request(array, close=True)
    pieces = 6
    step = -(-len(body) // pieces)
    with serve(SHORT) as served, \
            socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(head)
        start = time.monotonic()
        for i in range(pieces):  # 6 pieces 0.4 s apart: longer than the body timeout in all
            time.sleep(0.4)
            sock.sendall(body[i * step:(i + 1) * step])
        assert time.monotonic() - start > BODY_TIMEOUT
        answer = _read_to_eof(sock)
        assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:200]
        np.testing.assert_array_equal(_answer_array(answer.split(b"\r\n\r\n", 1)[1]), array)
        served.wait_clean()


def test_a_client_leaving_while_the_reader_holds_the_slot_frees_it(served: Served) -> None:
    head, body = _large_request(np.zeros(BODY_SLOT_MIN_BYTES, dtype=np.float32))
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(head + body[:100])
        time.sleep(0.1)
        sock.sendall(body[100:len(body) // 3])
        time.sleep(0.2)
    served.wait_clean()
    assert served.dataplane.requests == []
    assert served.dataplane.allocations >= 1


@pytest.fixture
def served() -> Any:
    with serve() as running:
        yield running


def test_a_large_body_refused_early_keeps_the_connection_framed(fed_bytes: list[int]) -> None:
    """The restricted-API gate answers 403 before the body is read; the rest of the body is
    still taken off the connection by the reader (and dropped, never parsed), so the next
    request there is served."""
    restricted = settings_from_flags(
        model_repositories=["/models"], http_max_input_size=LIMIT,
        http_restricted_apis=[("inference", "infer-key", "yes")]).for_frontends()
    head, body = _large_request(np.ones(BODY_SLOT_MIN_BYTES, dtype=np.float32))
    with serve(settings=restricted) as served, \
            socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(head + body[:100])
        time.sleep(0.3)  # refused meanwhile
        sock.sendall(body[100:] + _small_request(2.0, "infer-key: yes\r\n"))
        answers = _read_answers(sock, 2)
        assert [status for status, _ in answers] == [b"HTTP/1.1 403 Forbidden",
                                                     b"HTTP/1.1 200 OK"]
        assert json.loads(answers[1][1])["outputs"][0]["data"] == [2.0]
        served.wait_clean()
    # the 100 bytes of the headers' read and the small request's body, nothing more
    assert sum(fed_bytes) < 1000, "the refused body's rest went through the parser"


def test_a_refused_body_still_arriving_is_not_an_idle_connection() -> None:
    """After the early 403 the keep-alive idle timer runs; the dropped body's reads stop it, as
    the protocol's own reads would, so a body slower than the idle timeout keeps the
    connection."""
    restricted = settings_from_flags(
        model_repositories=["/models"], http_max_input_size=LIMIT,
        http_restricted_apis=[("inference", "infer-key", "yes")]).for_frontends()
    idle = HttpLimits(header_timeout_s=5.0, body_timeout_s=5.0, idle_timeout_s=BODY_TIMEOUT,
                      max_body_bytes=LIMIT, max_connections=16, over_cap=1)
    head, body = _large_request(np.ones(BODY_SLOT_MIN_BYTES, dtype=np.float32))
    pieces = 5
    step = -(-(len(body) - 100) // pieces)
    with serve(idle, restricted) as served, \
            socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(head + body[:100])
        time.sleep(0.3)  # refused meanwhile: the idle timer starts
        for i in range(pieces):  # 5 pieces 0.4 s apart: longer than the idle timeout
            sock.sendall(body[100 + i * step:100 + (i + 1) * step])
            time.sleep(0.4)
        sock.sendall(_small_request(3.0, "infer-key: yes\r\n"))
        answers = _read_answers(sock, 2)
        assert [status for status, _ in answers] == [b"HTTP/1.1 403 Forbidden",
                                                     b"HTTP/1.1 200 OK"]
        assert json.loads(answers[1][1])["outputs"][0]["data"] == [3.0]
        served.wait_clean()
