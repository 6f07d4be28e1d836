"""Where the time of a large HTTP binary round trip goes: the server's part vs the client's.
From the repository root:

    .venv/bin/python -m bench.http_large_bench                # 64 MB, this checkout
    .venv/bin/python -m bench.http_large_bench --checkout DIR # the same against another tree

One server (``bench.shm_bench``'s repository: ``copy_fp32`` returns its FP32 input) and, per
size, the median of calls made one at a time:

- memcpy: ``np.copyto`` between two pre-faulted arrays (the unit of the issue's target);
- raw round trip: a keep-alive socket sends a request built once (JSON header + the tensor's
  bytes, ``Inference-Header-Content-Length``) and reads the answer into a buffer allocated once
  (``recv_into``): what is left is the server's part plus the loopback's own send / receive
  copies, the nearest a client gets to the server's part;
- loopback floor: the same raw client against a minimal uvloop server in a process of its own
  that reads the request's bytes into a buffer made once (``BufferedProtocol``) and answers as
  many from a buffer made once (no parsing, no model): what the kernel's loopback copies and the
  client's reads cost, so
  "raw round trip - loopback floor" is the server's own part;
- CPU ms per raw round trip of the server's frontend, broker and worker processes (user +
  system, from /proc): the server's work, far less disturbed by a busy machine than wall time;
  and of the echo server (``cpu_echo``): ``cpu_server_extra`` = the server's CPU minus the
  echo's is the server's own work beyond the loopback copies, ``cpu_extra_x_memcpy`` that over
  the fastest memcpy (the load-robust counterpart of "server's part x memcpy");
- tritonclient round trip: ``set_data_from_numpy`` .. ``as_numpy`` (``bench.shm_bench``'s HTTP
  binary column);
- tritonclient encode / decode: its request body built (``generate_request_body``) and the
  answer parsed (``InferResult.from_response_body`` + ``as_numpy``) in process, no server.

Prints a JSON line per size and a small table; writes nothing (numbers on a shared machine are
indicative only). The JSON also holds each wall time's minimum (``*_min``, and
``server_part_min`` / ``server_x_memcpy_min`` from them): on a busy machine the fastest call is
the nearest to the uncontended cost, the median is what a caller sees.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import psutil  # type: ignore[import-untyped]
import uvloop

from bench import servers
from bench.shm_bench import MODEL, measure_http, timed, timed_spread, write_repository

REPEATS = {1: 30, 16: 15, 64: 9, 256: 5}


def measure_memcpy(x: np.ndarray, repeat: int) -> tuple[float, float]:
    target = np.ones_like(x)  # pages faulted in, as the regions' are
    return timed_spread(lambda: np.copyto(target, x), repeat * 3)


@contextlib.contextmanager
def server(root: pathlib.Path, checkout: pathlib.Path | None,
           extra_args: list[str]) -> Iterator[tuple[int, servers.Server]]:
    """The HTTP port of a server (from ``checkout``'s sources when given) for the block."""
    repo = write_repository(root)
    http, grpc, metrics = servers.free_port(), servers.free_port(), servers.free_port()
    env = dict(os.environ)
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    command = [sys.executable, "-m", "shoal", "serve", f"--model-repository={repo}",
               f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
               "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
               f"--http-max-input-size={512 * 2**20}", f"--shm-arena-byte-size={2 * 2**30}",
               *extra_args]
    with open(root / "shoal.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   cwd=checkout)
    running = servers.Server("shoal", http, process, root, root / "shoal.log")
    try:
        try:
            servers.wait_ready(f"http://127.0.0.1:{http}/v2/health/ready", process)
        except RuntimeError:
            print((root / "shoal.log").read_text()[-3000:], file=sys.stderr)
            raise
        yield http, running
    finally:
        running.stop()


def binary_request(x: np.ndarray) -> bytes:
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [x.size],
                    "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    head = (f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: bench\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: "
            f"{len(header) + x.nbytes}\r\nInference-Header-Content-Length: {len(header)}"
            "\r\n\r\n").encode()
    return head + header + x.tobytes()


class RawClient:
    """One keep-alive connection; answers land in a buffer allocated once."""

    def __init__(self, port: int, capacity: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=300)
        self.buffer = bytearray(capacity)
        self.view = memoryview(self.buffer)

    def round_trip(self, request: bytes) -> memoryview:
        self.sock.sendall(request)
        received = 0
        head_end = -1
        while head_end < 0:
            received += self.sock.recv_into(self.view[received:])
            head_end = self.buffer.find(b"\r\n\r\n", 0, received)
        length = 0
        for line in bytes(self.view[:head_end]).lower().split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name == b"content-length":
                length = int(value)
        total = head_end + 4 + length
        while received < total:
            got = self.sock.recv_into(self.view[received:total])
            if not got:
                raise RuntimeError("server closed the connection")
            received += got
        return self.view[head_end + 4:total]

    def close(self) -> None:
        self.sock.close()


ROLES = {"shoal.frontend": "frontend", "shoal.broker": "broker", "shoal.workers": "worker"}


def cpu_seconds(running: servers.Server) -> dict[str, float]:
    """CPU time (user + system) used so far by the server's frontend, broker and workers."""
    used = dict.fromkeys(ROLES.values(), 0.0)
    for process in running.processes():
        with contextlib.suppress(psutil.NoSuchProcess):
            command = " ".join(process.cmdline()[:3])
            role = next((r for module, r in ROLES.items() if module in command), None)
            if role is not None:
                times = process.cpu_times()
                used[role] += times.user + times.system
    return used


def cpu_us_per_request(before: dict[str, float], after: dict[str, float], requests_per_s: float,
                       seconds: float) -> dict[str, float]:
    """``cpu_us_<role>``: CPU µs per answered request of each role between two ``cpu_seconds``
    readings taken around a cell of ``seconds`` that answered ``requests_per_s``."""
    answered = max(1.0, requests_per_s * seconds)
    return {f"cpu_us_{role}": round((after[role] - before[role]) / answered * 1e6, 1)
            for role in after}


def measure_raw(port: int, running: servers.Server, x: np.ndarray,
                repeat: int) -> dict[str, float]:
    """Median round trip (ms) and each server process's CPU ms per request: CPU time is what
    the server spends, much less disturbed by other load on the machine than wall time."""
    request = binary_request(x)
    client = RawClient(port, x.nbytes + (1 << 20))
    try:
        body = client.round_trip(request)
        if body[-x.nbytes:] != memoryview(x.tobytes()):
            raise RuntimeError("raw round trip returned wrong data")
        before = cpu_seconds(running)
        median, fastest = timed_spread(lambda: client.round_trip(request), repeat, warmup=0)
        after = cpu_seconds(running)
        result = {"raw_round_trip": median, "raw_round_trip_min": fastest}
        for role in before:
            result[f"cpu_{role}"] = (after[role] - before[role]) / repeat * 1e3
        return result
    finally:
        client.close()


class _EchoProtocol(asyncio.BufferedProtocol):
    """Reads ``request_bytes`` into one buffer made once (no ``bytes`` per read, as the lean
    transport reads a large body), then writes ``answer`` (HTTP head + body) back."""

    def __init__(self, request_bytes: int, answer: bytes) -> None:
        self.request_bytes = request_bytes
        self.answer = answer
        self.buffer = memoryview(bytearray(request_bytes))
        self.seen = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer[self.seen:]

    def buffer_updated(self, nbytes: int) -> None:
        self.seen += nbytes
        if self.seen == self.request_bytes:
            self.seen = 0
            assert self.transport is not None
            self.transport.write(self.answer)


def _serve_echo(listening: socket.socket, request_bytes: int, answer: bytes) -> None:
    """The loopback floor's server, in a process of its own (no GIL shared with the client)."""
    loop = uvloop.new_event_loop()
    loop.run_until_complete(loop.create_server(
        lambda: _EchoProtocol(request_bytes, answer), sock=listening))
    loop.run_forever()


def measure_loopback_floor(x: np.ndarray, repeat: int) -> tuple[float, float, float]:
    """(median, minimum) round trip ms against the echo server, and the echo server's CPU ms
    per round trip (its two loopback copies: what any server spends on the bytes)."""
    request = binary_request(x)
    body = x.tobytes()
    answer = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1)
    port = listening.getsockname()[1]
    echo = multiprocessing.get_context("fork").Process(
        target=_serve_echo, args=(listening, len(request), answer), daemon=True)
    echo.start()
    listening.close()
    client = RawClient(port, x.nbytes + (1 << 20))
    try:
        for _ in range(3):
            client.round_trip(request)
        echo_process = psutil.Process(echo.pid)
        before = echo_process.cpu_times()
        median, fastest = timed_spread(lambda: client.round_trip(request), repeat, warmup=0)
        after = echo_process.cpu_times()
        cpu = (after.user + after.system - before.user - before.system) / repeat * 1e3
        return median, fastest, cpu
    finally:
        client.close()
        echo.kill()
        echo.join(10)


def measure_client_codec(x: np.ndarray, repeat: int) -> dict[str, float]:
    """tritonclient's own work per call, no server: encoding the request, decoding the answer."""
    import tritonclient.http as httpclient

    def encode() -> Any:
        inp = httpclient.InferInput("INPUT0", [x.size], "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        return httpclient.InferenceServerClient.generate_request_body([inp], outputs=[out])

    header = json.dumps({"model_name": MODEL, "model_version": "1", "outputs": [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [x.size],
         "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    answer = header + x.tobytes()

    def decode() -> Any:
        result = httpclient.InferResult.from_response_body(answer, False, len(header))
        return result.as_numpy("OUTPUT0")

    return {"client_encode": timed(encode, repeat), "client_decode": timed(decode, repeat)}


def run(sizes: list[int], checkout: pathlib.Path | None,
        extra_args: list[str]) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="shoal-http-large-") as tmp, \
            server(pathlib.Path(tmp), checkout, extra_args) as (port, running):
        for size_mb in sizes:
            x = np.random.default_rng(size_mb).standard_normal(size_mb * 2**18,
                                                               dtype=np.float32)
            repeat = REPEATS.get(size_mb, 5)
            row: dict[str, Any] = {"size_mb": size_mb, "load": os.getloadavg()[0]}
            row["memcpy"], row["memcpy_min"] = measure_memcpy(x, repeat)
            row.update(measure_raw(port, running, x, repeat))
            row["loopback_floor"], row["loopback_floor_min"], row["cpu_echo"] = \
                measure_loopback_floor(x, repeat)
            # the server's CPU beyond what the echo server spends on the same bytes
            row["cpu_server_extra"] = (row["cpu_frontend"] + row["cpu_broker"]
                                       + row["cpu_worker"] - row["cpu_echo"])
            row["cpu_extra_x_memcpy"] = row["cpu_server_extra"] / row["memcpy_min"]
            row["server_part"] = row["raw_round_trip"] - row["loopback_floor"]
            row["server_part_min"] = row["raw_round_trip_min"] - row["loopback_floor_min"]
            row["server_x_memcpy_min"] = row["server_part_min"] / row["memcpy_min"]
            row["tritonclient_round_trip"] = measure_http(port, x, repeat)
            row.update(measure_client_codec(x, repeat))
            row["server_x_memcpy"] = row["server_part"] / row["memcpy"]
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64", help="comma-separated MB")
    parser.add_argument("--checkout", type=pathlib.Path, default=None,
                        help="serve from this source tree (e.g. a git worktree of a base)")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="one more `shoal serve` flag, e.g. --server-arg="
                        "--shm-segment-byte-size=134217728 (repeatable)")
    args = parser.parse_args()
    rows = run([int(s) for s in args.sizes.split(",")], args.checkout, args.server_arg)
    print("| size | memcpy | raw round trip | loopback floor | server's part | x memcpy "
          "| min: server's part / x memcpy | CPU beyond echo / x memcpy "
          "| CPU frontend / broker / worker | tritonclient round trip | tritonclient encode "
          "| decode |")
    for row in rows:
        print(f"| {row['size_mb']} MB | {row['memcpy']:.2f} | {row['raw_round_trip']:.2f} | "
              f"{row['loopback_floor']:.2f} | {row['server_part']:.2f} | "
              f"{row['server_x_memcpy']:.1f}x | {row['server_part_min']:.2f} / "
              f"{row['server_x_memcpy_min']:.1f}x | {row['cpu_server_extra']:.1f} / "
              f"{row['cpu_extra_x_memcpy']:.1f}x | {row['cpu_frontend']:.1f} / "
              f"{row['cpu_broker']:.1f} / {row['cpu_worker']:.1f} | "
              f"{row['tritonclient_round_trip']:.2f} | {row['client_encode']:.2f} | "
              f"{row['client_decode']:.2f} |")


if __name__ == "__main__":
    main()
