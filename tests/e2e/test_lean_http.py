"""The lean HTTP transport for infer (``frontend/http/lean.py``) on a real server: the corners
of HTTP/1.1 it now handles itself (pipelining, ``Expect: 100-continue``, chunked bodies,
HTTP/1.0, ``Connection: close``, compression) and large binary tensors (the body read into one
arena slot, the answer written from the worker's memory), byte-exact."""

from __future__ import annotations

import gzip
import json
import pathlib
import socket
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.conftest import serving
from tests.e2e.models import identity_all_model
from tests.e2e.server import ShoalServer

INFER = "/v2/models/identity_all/infer"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    """One model (an identity per datatype): quick to start on a busy machine."""
    repo: pathlib.Path = tmp_path_factory.mktemp("lean_repo")
    identity_all_model(repo)
    with serving(ShoalServer([str(repo)])) as srv:
        yield srv


def _json_body(values: list[int]) -> bytes:
    return json.dumps({"inputs": [{"name": "IN_INT32", "datatype": "INT32",
                                   "shape": [len(values)], "data": values}],
                       "outputs": [{"name": "OUT_INT32"}]}).encode()


def _request(body: bytes, extra: str = "", version: str = "1.1") -> bytes:
    return (f"POST {INFER} HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


class _Reader:
    """Reads HTTP responses off a raw socket, one at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def head(self) -> tuple[str, dict[str, str]]:
        while b"\r\n\r\n" not in self.buffer:
            assert self._fill(), f"connection closed mid-head: {self.buffer!r}"
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    def response(self) -> tuple[str, dict[str, str], bytes]:
        status, headers = self.head()
        length = int(headers["content-length"])
        while len(self.buffer) < length:
            assert self._fill(), "connection closed mid-body"
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, headers, body

    def closed(self) -> bool:
        self.sock.settimeout(5)
        return not self._fill()


def _connect(server: ShoalServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
    sock.settimeout(10)
    return sock


def _values(body: bytes) -> list[int]:
    output = json.loads(body)["outputs"][0]
    assert output["name"] == "OUT_INT32"
    return list(output["data"])


def test_pipelined_infer_requests_are_answered_in_order(server: ShoalServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"".join(_request(_json_body([i, i + 1])) for i in range(5)))
        reader = _Reader(sock)
        for i in range(5):
            status, _, body = reader.response()
            assert status == "HTTP/1.1 200 OK", body
            assert _values(body) == [i, i + 1]


def test_expect_100_continue_gets_100_then_the_answer(server: ShoalServer) -> None:
    body = _json_body([7])
    with _connect(server) as sock:
        head, _, _ = _request(body, "Expect: 100-continue\r\n").partition(b"\r\n\r\n")
        sock.sendall(head + b"\r\n\r\n")
        reader = _Reader(sock)
        status, _ = reader.head()
        assert status == "HTTP/1.1 100 Continue"
        sock.sendall(body)
        status, headers, answer = reader.response()
        assert status == "HTTP/1.1 200 OK"
        assert headers["content-type"] == "application/json"
        assert _values(answer) == [7]


def test_a_chunked_body_is_served(server: ShoalServer) -> None:
    body = _json_body([1, 2, 3])
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:10], body[10:]))
    with _connect(server) as sock:
        sock.sendall(f"POST {INFER} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     .encode() + chunks + b"0\r\n\r\n")
        status, _, answer = _Reader(sock).response()
        assert status == "HTTP/1.1 200 OK"
        assert _values(answer) == [1, 2, 3]


def test_http_1_0_and_connection_close_are_answered_then_closed(server: ShoalServer) -> None:
    for request in (_request(_json_body([4]), version="1.0"),
                    _request(_json_body([4]), "Connection: close\r\n")):
        with _connect(server) as sock:
            sock.sendall(request)
            reader = _Reader(sock)
            status, headers, answer = reader.response()
            assert status == "HTTP/1.1 200 OK"
            assert headers["connection"] == "close"
            assert _values(answer) == [4]
            assert reader.closed()


def test_keep_alive_serves_infer_and_other_routes_on_one_connection(server: ShoalServer) -> None:
    with _connect(server) as sock:
        reader = _Reader(sock)
        for i in range(3):
            sock.sendall(_request(_json_body([i])))
            assert _values(reader.response()[2]) == [i]
            sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            assert reader.response()[0] == "HTTP/1.1 200 OK"


def test_gzip_request_and_response(server: ShoalServer) -> None:
    response = httpx.post(f"http://127.0.0.1:{server.http_port}{INFER}",
                          content=gzip.compress(_json_body([5, 6])),
                          headers={"Content-Encoding": "gzip", "Accept-Encoding": "gzip"})
    assert response.status_code == 200
    assert response.headers["content-encoding"] == "gzip"
    assert _values(response.content) == [5, 6]  # httpx inflated it


def test_errors_on_the_lean_path_name_the_problem(server: ShoalServer) -> None:
    url = f"http://127.0.0.1:{server.http_port}"
    response = httpx.post(f"{url}/v2/models/no_such_model/infer", content=_json_body([1]))
    assert response.status_code == 404  # Triton's NOT_FOUND
    assert "no_such_model" in response.json()["error"]
    response = httpx.post(f"{url}{INFER}", content=b"{\"inputs\": 3}")
    assert response.status_code == 400
    assert "inputs" in response.json()["error"]


def _infer_binary(server: ShoalServer, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}",
                                              network_timeout=120)
    try:
        inputs = []
        for name, array in arrays.items():
            tensor = httpclient.InferInput(name, list(array.shape),
                                           "FP32" if array.dtype == np.float32 else "INT8")
            tensor.set_data_from_numpy(array, binary_data=True)
            inputs.append(tensor)
        outputs = [httpclient.InferRequestedOutput("OUT_" + name[3:], binary_data=True)
                   for name in arrays]
        result = client.infer("identity_all", inputs, outputs=outputs)
        return {name: result.as_numpy("OUT_" + name[3:]) for name in arrays}
    finally:
        client.close()


def test_a_large_binary_tensor_round_trips_exactly(server: ShoalServer) -> None:
    array = np.random.default_rng(1).standard_normal(4 << 20, dtype=np.float32)  # 16 MB
    for _ in range(2):  # the second reuses the freed body slot
        got = _infer_binary(server, {"IN_FP32": array})
        np.testing.assert_array_equal(got["IN_FP32"], array)


def test_large_binary_inputs_off_the_alignment_are_copied_exactly(server: ShoalServer) -> None:
    small = np.arange(3, dtype=np.int8)  # puts the FP32 input at an unaligned body offset
    array = np.random.default_rng(2).standard_normal(1 << 20, dtype=np.float32)
    got = _infer_binary(server, {"IN_INT8": small, "IN_FP32": array})
    np.testing.assert_array_equal(got["IN_INT8"], small)
    np.testing.assert_array_equal(got["IN_FP32"], array)
