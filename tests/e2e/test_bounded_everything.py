"""Issue 26 part 5, "bounded everything", against real server processes: answers stay valid JSON
with non-finite floats, a tensor that can never fit the shared-memory arena is the client's
error (4xx naming the limit), a body of countless tiny chunks is refused early, an endless
HTTP/2 header block neither grows the frontend nor blocks other calls (and the idle limit ends
it), and a model's flood of output is rate-limited in the log."""

from __future__ import annotations

import json
import math
import os
import pathlib
import socket
import struct
import textwrap
import time
from collections.abc import Iterator

import httpx
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import serving
from tests.e2e.models import identity_model
from tests.e2e.server import ShoalServer

SEGMENT = 1024 * 1024
ARENA = 4 * SEGMENT  # every process's arena: at most 4 MiB
IDLE_MS = 2000

ZEROS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            n = int(pb_utils.get_input_tensor_by_name(r, "COUNT").as_numpy()[0])
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("ZEROS", np.zeros(n, np.float32))]))
        return out
"""

# prints ~40 MB on every request, then answers its input
CHATTY_MODEL = """
import sys
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        line = "chatter " + "x" * 92 + "\\n"
        for _ in range(400_000):
            sys.stdout.write(line)
        sys.stdout.flush()
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""


def _write(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    """A server with 4 MiB arenas and a 2 s gRPC idle limit, over an identity, a model whose
    output size the request sets, and a model that floods stdout."""
    repo = tmp_path_factory.mktemp("bounded")
    identity_model(repo, "identity", "FP32")
    identity_model(repo, "chatty", "FP32")
    (repo / "chatty" / "1" / "model.py").write_text(textwrap.dedent(CHATTY_MODEL).lstrip())
    _write(repo / "zeros" / "config.pbtxt", """
        name: "zeros"
        backend: "python"
        max_batch_size: 0
        input [{ name: "COUNT" data_type: TYPE_INT64 dims: [ 1 ] }]
        output [{ name: "ZEROS" data_type: TYPE_FP32 dims: [ -1 ] }]
    """)
    _write(repo / "zeros" / "1" / "model.py", ZEROS_MODEL)
    args = [f"--shm-segment-byte-size={SEGMENT}", f"--shm-arena-byte-size={ARENA}",
            f"--grpc-max-connection-idle={IDLE_MS}"]
    with serving(ShoalServer([str(repo)], args)) as srv:
        yield srv


def _strict_json(body: bytes) -> object:
    def refuse(token: str) -> object:
        raise ValueError(f"not JSON: {token}")

    return json.loads(body, parse_constant=refuse)


# ------------------------------------------------------------------ a. NaN / Infinity


def test_non_finite_floats_in_a_json_answer_are_valid_json(server: ShoalServer) -> None:
    values = np.array([[1.5, math.nan, math.inf, -math.inf] * 4], np.float32)
    raw = values.tobytes()
    head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                                   "parameters": {"binary_data_size": len(raw)}}],
                       "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]})
    reply = httpx.post(f"{server.base}/v2/models/identity_fp32/infer", content=head.encode() + raw,
                       headers={"Inference-Header-Content-Length": str(len(head))})
    assert reply.status_code == 200, reply.text
    document = _strict_json(reply.content)  # Triton 2.51 writes bare NaN / Infinity here
    assert isinstance(document, dict)
    assert document["outputs"][0]["data"][:4] == [1.5, "NaN", "Infinity", "-Infinity"]
    # tritonclient's JSON input (bare NaN, as its rapidjson writes it) and JSON output
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(values, binary_data=False)
    result = client.infer("identity_fp32", [tensor], outputs=[
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)
    client.close()


# ------------------------------------------------------------------ b. tensors beyond the arena


def test_a_tensor_larger_than_the_arena_is_the_clients_error(bounded: ShoalServer) -> None:
    workers = set(bounded.worker_pids("identity"))
    big = np.zeros(ARENA // 4 + 1024, np.float32)  # 4 MiB + 4 KiB: can never fit
    client = httpclient.InferenceServerClient(bounded.url)
    tensor = httpclient.InferInput("INPUT0", [big.size], "FP32")
    tensor.set_data_from_numpy(big)
    with pytest.raises(InferenceServerException) as http_error:
        client.infer("identity", [tensor])
    assert http_error.value.status() == "400"
    assert "--shm-arena-byte-size" in str(http_error.value.message())
    grpc = grpcclient.InferenceServerClient(bounded.grpc_url)
    grpc_tensor = grpcclient.InferInput("INPUT0", [big.size], "FP32")
    grpc_tensor.set_data_from_numpy(big)
    with pytest.raises(InferenceServerException) as grpc_error:
        grpc.infer("identity", [grpc_tensor])
    assert grpc_error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "--shm-arena-byte-size" in str(grpc_error.value.message())
    # what fits is still served, by the same worker
    small = httpclient.InferInput("INPUT0", [4], "FP32")
    small.set_data_from_numpy(np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(client.infer("identity", [small]).as_numpy("OUTPUT0"),
                                  np.arange(4, dtype=np.float32))
    assert set(bounded.worker_pids("identity")) == workers
    client.close()
    grpc.close()


def test_an_output_larger_than_the_arena_is_the_clients_error(bounded: ShoalServer) -> None:
    workers = set(bounded.worker_pids("zeros"))
    client = httpclient.InferenceServerClient(bounded.url)

    def ask(count: int) -> httpclient.InferResult:
        tensor = httpclient.InferInput("COUNT", [1], "INT64")
        tensor.set_data_from_numpy(np.array([count], np.int64))
        return client.infer("zeros", [tensor])

    with pytest.raises(InferenceServerException) as error:
        ask(ARENA // 4 + 1024)  # the worker's arena can never hold the answer
    assert error.value.status() == "400"
    assert "--shm-arena-byte-size" in str(error.value.message())
    assert ask(1000).as_numpy("ZEROS").shape == (1000,)
    assert set(bounded.worker_pids("zeros")) == workers
    client.close()


# ------------------------------------------------------------------ c. tiny chunks


def test_a_body_of_countless_one_byte_chunks_is_refused_early(server: ShoalServer) -> None:
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        sent = 0
        try:
            for _ in range(100):  # up to 10^6 chunks, 10^4 at a time
                sock.sendall(b"1\r\n \r\n" * 10_000)
                sent += 10_000
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            piece = sock.recv(65536)
            if not piece:
                break
            answer += piece
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"pieces" in answer
    assert httpx.get(f"{server.base}/v2/health/live").status_code == 200


def test_a_streamed_body_of_ordinary_chunks_is_served(server: ShoalServer) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                                   "data": [float(i) for i in range(16)]}]}).encode()

    def pieces() -> Iterator[bytes]:
        for at in range(0, len(body), 16):  # ~20 chunks of 16 bytes
            yield body[at:at + 16]

    reply = httpx.post(f"{server.base}/v2/models/identity_fp32/infer", content=pieces())
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [float(i) for i in range(16)]


# ------------------------------------------------------------------ d. HTTP/2 CONTINUATION


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) \
        + struct.pack(">I", stream) + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, new name (both under 127 bytes)."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def _open_header_block(port: int) -> socket.socket:
    """A connection that sent the preface, SETTINGS and a HEADERS frame without END_HEADERS."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0, b""))
    block = b"\x83\x86" + _literal(b":path", b"/inference.GRPCInferenceService/ServerLive") \
        + _literal(b":authority", b"x") + _literal(b"content-type", b"application/grpc")
    sock.sendall(_frame(1, 0, 1, block))
    return sock


def _continuation(serial: int) -> bytes:
    """A CONTINUATION frame of 200 new headers (~14 KB), none END_HEADERS."""
    return _frame(9, 0, 1, b"".join(_literal(b"x-h%d" % (serial * 200 + j), b"v" * 60)
                                    for j in range(200)))


def test_an_endless_header_block_grows_nothing_and_blocks_no_one(server: ShoalServer) -> None:
    frontend = psutil.Process(server.frontend_pids()[0])
    before = frontend.memory_info().rss
    sock = _open_header_block(server.grpc_port)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for serial in range(4800):  # ~64 MiB of header block
            sock.sendall(_continuation(serial))
        # grpc core discards metadata past its hard limit: the flood costs no memory
        assert frontend.memory_info().rss - before < 48 * 1024 * 1024
        assert grpc.is_server_live()  # other connections are served meanwhile
    finally:
        sock.close()
        grpc.close()
    assert httpx.get(f"{server.base}/v2/health/live").status_code == 200


def test_the_grpc_idle_limit_ends_an_endless_header_block(bounded: ShoalServer) -> None:
    sock = _open_header_block(bounded.grpc_port)
    closed = False
    deadline = time.monotonic() + 60
    serial = 0
    try:
        while time.monotonic() < deadline:  # ~1.4 MB/s, forever unless the server ends it
            sock.sendall(_continuation(serial))
            serial += 1
            time.sleep(0.01)
    except (BrokenPipeError, ConnectionResetError):
        closed = True
    finally:
        sock.close()
    assert closed, "the connection was still accepting header frames"
    grpc = grpcclient.InferenceServerClient(bounded.grpc_url)
    assert grpc.is_server_live()
    grpc.close()


# ------------------------------------------------------------------ e. model output


def test_a_models_output_flood_is_rate_limited(bounded: ShoalServer) -> None:
    size_before = os.path.getsize(bounded.log_path)
    workers = set(bounded.worker_pids("chatty"))
    client = httpclient.InferenceServerClient(bounded.url, network_timeout=120)
    tensor = httpclient.InferInput("INPUT0", [2], "FP32")
    tensor.set_data_from_numpy(np.array([1, 2], np.float32))
    assert client.infer("chatty", [tensor]).as_numpy("OUTPUT0").tolist() == [1.0, 2.0]
    client.close()
    note = "bytes of output from model chatty instance"
    deadline = time.monotonic() + 30
    text = ""
    while time.monotonic() < deadline:
        with open(bounded.log_path, errors="replace") as log:
            log.seek(size_before)
            text = log.read()
        if note in text:
            break
        time.sleep(0.2)
    assert note in text, text[-2000:]
    grown = os.path.getsize(bounded.log_path) - size_before
    assert grown < 8 * 1024 * 1024, f"the log grew by {grown} bytes for 40 MB of output"
    assert "chatter " in text  # the burst passes
    assert set(bounded.worker_pids("chatty")) == workers
