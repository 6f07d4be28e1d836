"""The lean infer transport in-process: uvicorn with GuardedHttpProtocol over the real app and a
FakeDataPlane, raw-socket and httpx clients. Checks that infer never reaches the ASGI app, and
the memory contracts: the body slot and every lease are given back, whatever the client does."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
import uvloop

from shoal.frontend.http.app import create_asgi_app
from shoal.frontend.http.fastpath import InferFastPath
from shoal.frontend.http.guard import HttpLimits, guarded_protocol
from shoal.frontend.http.lean import BODY_SLOT_MIN_BYTES, ROUTE_CACHE_SIZE, LeanInfer, infer_route
from shoal.messages import TensorSpec
from shoal.settings import FrontendSettings, settings_from_flags
from tests.frontend.http.fakes import FakeDataPlane, make_model

LIMIT = 8 << 20
SETTINGS = settings_from_flags(model_repositories=["/models"],
                               http_max_input_size=LIMIT).for_frontends()
LIMITS = HttpLimits(header_timeout_s=5.0, body_timeout_s=5.0, idle_timeout_s=5.0,
                    max_body_bytes=LIMIT, max_connections=16, over_cap=1)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Served:
    def __init__(self, port: int, dataplane: FakeDataPlane, asgi_infers: list[str]) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.dataplane = dataplane
        self.asgi_infers = asgi_infers

    def wait_clean(self) -> None:
        """Every slot freed and every lease of an answered request released (within 5 s)."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not self._clean():
            time.sleep(0.01)
        assert self.dataplane.live_slots == {}
        assert self._clean()

    def _clean(self) -> bool:
        dataplane = self.dataplane
        leases = sorted(lease.lease_id for lease in dataplane.released if lease is not None)
        return not dataplane.live_slots and leases == sorted(
            r.request_id for r in dataplane.requests)


@contextlib.contextmanager
def serve(limits: HttpLimits = LIMITS, settings: FrontendSettings = SETTINGS) -> Iterator[Served]:
    """uvicorn with GuardedHttpProtocol (``limits``) over the real app and a FakeDataPlane, in
    a thread, for the block."""
    dataplane = FakeDataPlane(models=[make_model("identity", [TensorSpec("INPUT0", "FP32", [-1])])])
    app = create_asgi_app(dataplane, settings)  # type: ignore[arg-type]
    assert isinstance(app, InferFastPath)
    asgi_infers: list[str] = []

    async def refuse(scope: dict[str, Any], *args: Any) -> None:  # the ASGI infer path
        asgi_infers.append(scope["path"])
        raise AssertionError("infer reached the ASGI app")

    app._serve_infer = refuse  # type: ignore[method-assign, assignment]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = uvicorn.Config(app, log_level="warning", lifespan="off", ws="none",
                            http=guarded_protocol(limits))
    server = _Server(config)
    thread = threading.Thread(target=lambda: uvloop.run(server.serve(sockets=[sock])))
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        yield Served(sock.getsockname()[1], dataplane, asgi_infers)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture
def served() -> Iterator[Served]:
    with serve() as running:
        yield running


def binary_request(array: np.ndarray[Any, Any], binary_output: bool = True) -> tuple[bytes, int]:
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(array.shape),
                    "parameters": {"binary_data_size": array.nbytes}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": binary_output}}],
    }).encode()
    return header + array.tobytes(), len(header)


def post_binary(served: Served, array: np.ndarray[Any, Any]) -> httpx.Response:
    body, header_length = binary_request(array)
    return httpx.post(f"{served.url}/v2/models/identity/infer", content=body, timeout=30,
                      headers={"Inference-Header-Content-Length": str(header_length)})


def answer_array(response: httpx.Response) -> np.ndarray[Any, Any]:
    header_length = int(response.headers["inference-header-content-length"])
    header = json.loads(response.content[:header_length])
    assert header["outputs"][0]["parameters"]["binary_data_size"] == \
        len(response.content) - header_length
    return np.frombuffer(response.content[header_length:], np.float32)


@pytest.mark.parametrize("path", ["/v2/models/identity/infer",
                                  "/v2/models/identity/versions/1/infer",
                                  "/v2/models/%69dentity/infer?x=1"])
def test_infer_is_answered_by_the_protocol_not_the_asgi_app(served: Served, path: str) -> None:
    response = httpx.post(served.url + path, json={
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.5, 2.5]}]})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert "date" in response.headers and response.headers["server"] == "uvicorn"
    assert response.json()["outputs"][0]["data"] == [1.5, 2.5]
    assert served.asgi_infers == []
    served.wait_clean()


def test_other_routes_still_go_to_the_asgi_app(served: Served) -> None:
    assert httpx.get(f"{served.url}/v2/health/live").status_code == 200
    assert httpx.get(f"{served.url}/v2/models/identity").json()["name"] == "identity"
    response = httpx.get(f"{served.url}/v2/models/identity/infer")  # wrong method: the router
    assert response.status_code == 405


def test_infer_route_matching() -> None:
    assert infer_route(b"POST", b"/v2/models/m/infer") == ("m", None)
    assert infer_route(b"POST", b"/v2/models/m/versions/3/infer?q=1") == ("m", "3")
    assert infer_route(b"POST", b"/v2/models/a%2Fb/infer") is None  # "/" in the name
    assert infer_route(b"GET", b"/v2/models/m/infer") is None
    assert infer_route(b"POST", b"/v2/models/m/versions/x/infer") is None
    assert infer_route(b"POST", b"/v2/models/m/inference") is None


def test_the_route_cache_answers_as_infer_route_and_stays_bounded() -> None:
    lean = LeanInfer(handler=Any, dataplane=Any, max_body=0, gate=None, tracer=None)
    cases = [(b"POST", b"/v2/models/m/infer"), (b"POST", b"/v2/models/m/versions/3/infer?q=1"),
             (b"POST", b"/v2/models/a%2Fb/infer"), (b"GET", b"/v2/models/m/infer"),
             (b"POST", b"/v2/models/m/versions/x/infer"), (b"POST", b"/v2/models/m%20x/infer"),
             (b"POST", b"/v2/health/ready")]
    for _ in range(2):  # the second time from the cache
        for method, url in cases:
            assert lean.route(method, url) == infer_route(method, url), url
    for index in range(3 * ROUTE_CACHE_SIZE):
        assert lean.route(b"POST", f"/v2/models/m{index}/infer".encode()) == (f"m{index}", None)
        assert len(lean._routes) <= ROUTE_CACHE_SIZE


def test_a_large_binary_answer_is_exact_and_every_lease_goes_back(served: Served) -> None:
    array = np.random.default_rng(0).standard_normal(BODY_SLOT_MIN_BYTES, dtype=np.float32)
    for _ in range(3):
        response = post_binary(served, array)
        assert response.status_code == 200, response.text
        np.testing.assert_array_equal(answer_array(response), array)
    served.wait_clean()


def test_a_small_binary_request_round_trips(served: Served) -> None:
    array = np.arange(10, dtype=np.float32)
    response = post_binary(served, array)
    np.testing.assert_array_equal(answer_array(response), array)
    served.wait_clean()


def _send_and_leave(served: Served, build: Callable[[], bytes]) -> None:
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(build())
        time.sleep(0.2)


def test_a_client_leaving_mid_body_frees_the_body_slot(served: Served) -> None:
    body, header_length = binary_request(
        np.zeros(BODY_SLOT_MIN_BYTES, dtype=np.float32))

    def half_request() -> bytes:
        return (f"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
                f"Content-Length: {len(body)}\r\nInference-Header-Content-Length: "
                f"{header_length}\r\n\r\n").encode() + body[:len(body) // 2]

    _send_and_leave(served, half_request)
    served.wait_clean()
    assert served.dataplane.allocations >= 1  # the body went into a slot
    assert served.dataplane.requests == []


def test_a_bad_large_request_frees_the_body_slot(served: Served) -> None:
    array = np.zeros(BODY_SLOT_MIN_BYTES, dtype=np.float32)
    body, header_length = binary_request(array)
    response = httpx.post(f"{served.url}/v2/models/identity/infer", content=body + b"xx",
                          headers={"Inference-Header-Content-Length": str(header_length)})
    assert response.status_code == 400
    assert "unexpected additional input data" in response.json()["error"]
    served.wait_clean()
    assert served.dataplane.allocations >= 1


def _read_answers(sock: socket.socket, count: int) -> list[tuple[bytes, bytes]]:
    """``count`` (status line, body) pairs off a keep-alive socket, in order."""
    data = b""
    answers: list[tuple[bytes, bytes]] = []
    while len(answers) < count:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, "connection closed early"
            data += chunk
        head, data = data.split(b"\r\n\r\n", 1)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(data) < length:
            data += sock.recv(65536)
        answers.append((head.split(b"\r\n")[0], data[:length]))
        data = data[length:]
    return answers


def test_pipelined_infer_and_asgi_requests_are_answered_in_order(served: Served) -> None:
    def infer(value: float) -> bytes:
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1],
                                       "data": [value]}]}).encode()
        return (f"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    health = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(infer(1.0) + health + infer(2.0) + health + infer(3.0))
        answers = _read_answers(sock, 5)
    assert [status for status, _ in answers] == [b"HTTP/1.1 200 OK"] * 5
    values = [json.loads(body)["outputs"][0]["data"] for _, body in answers[::2]]
    assert values == [[1.0], [2.0], [3.0]]
    assert served.asgi_infers == []
    served.wait_clean()
