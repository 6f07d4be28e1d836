"""Closed-loop load from compiled load generators: ``wrk`` (HTTP/1.1) and ``h2load`` (gRPC over
HTTP/2, from nghttp2), with the same figures as bench/loadgen.py and bench/grpc_loadgen.py.

Why: on this 2-core machine the load generator shares the cores with the server it measures.
The Python generators cost ~40 µs (HTTP, asyncio streams) and ~160 µs (gRPC, grpc.aio) of CPU
per request; wrk and h2load ~11-17 µs. A server that is bound by the machine's CPU (shoal)
loses to the Python generators what a server bound by its own latency does not, so the
compiled ones measure servers, not the generator. Both are Debian packages
(``apt-get install wrk nghttp2-client``); ``available()`` says whether they are installed and
bench/run.py falls back to the Python generators when not.

Closed loop as the Python generators: C connections (HTTP) or C concurrent streams over
ceil(C / 64) connections (gRPC, as grpc_loadgen opens one channel per 64 calls), each sending
the same pre-encoded request again as soon as its answer is complete, for a fixed duration.
Errors: HTTP answers that are not 2xx and socket errors (wrk); for gRPC, answers that are not
HTTP 2xx, and answers without the expected message (a gRPC error comes back as HTTP 200 with
``grpc-status`` in trailers and no message, which h2load does not read): the received DATA
bytes are compared with the count of answers times the size of one good answer, measured with
grpcio before the run.
"""

from __future__ import annotations

import json
import math
import pathlib
import shutil
import struct
import subprocess
import tempfile
from typing import Any

import grpc

from bench.grpc_loadgen import METHOD

_CALLS_PER_CONNECTION = 64
# wrk's Lua hook: one JSON line of the run's figures (latencies in µs) on stdout
_WRK_DONE = """
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, ' ..
    '"status_errors": %d, "socket_errors": %d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), e.status, e.connect + e.read + e.write + e.timeout))
end
"""


def available() -> bool:
    return shutil.which("wrk") is not None and shutil.which("h2load") is not None


def _lua_string(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a valid Lua string literal here


def wrk_script(body_file: pathlib.Path, headers: list[str]) -> str:
    """The wrk script sending ``body_file`` with ``headers`` ("Name: value") as bench/loadgen.py
    sends it (JSON as application/json, binary-extension bodies as octet-stream)."""
    binary = any(h.lower().startswith("inference-header-content-length") for h in headers)
    lines = ['wrk.method = "POST"',
             f"local f = assert(io.open({_lua_string(str(body_file))}, \"rb\"))",
             'wrk.body = f:read("*all")', "f:close()",
             'wrk.headers["Content-Type"] = '
             + _lua_string("application/octet-stream" if binary else "application/json")]
    for header in headers:
        name, value = header.split(":", 1)
        lines.append(f"wrk.headers[{_lua_string(name.strip())}] = {_lua_string(value.strip())}")
    return "\n".join(lines) + "\n" + _WRK_DONE


def http(port: int, path: str, body: tuple[pathlib.Path, list[str]], concurrency: int,
         seconds: float, host: str = "127.0.0.1") -> dict[str, float]:
    """bench/loadgen.run's figures from wrk: req/s of good answers, p50/p90/p99 ms (wrk's
    latency histogram covers every answer), errors."""
    with tempfile.TemporaryDirectory(prefix="shoal-wrk-") as tmp:
        script = pathlib.Path(tmp) / "request.lua"
        script.write_text(wrk_script(body[0], body[1]))
        out = subprocess.run(
            ["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--timeout", "60s",
             "-s", str(script), f"http://{host}:{port}{path}"],
            capture_output=True, text=True, check=True).stdout
    figures = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    errors = figures["status_errors"] + figures["socket_errors"]
    good = figures["requests"] - figures["status_errors"]
    return {"concurrency": concurrency,
            "requests_per_s": good / (figures["duration_us"] / 1e6),
            "p50_ms": figures["p50_us"] / 1e3, "p90_ms": figures["p90_us"] / 1e3,
            "p99_ms": figures["p99_us"] / 1e3, "errors": errors}


def grpc_answer_size(port: int, request: bytes, host: str = "127.0.0.1") -> int:
    """Bytes of one good ModelInferResponse to ``request`` (a failing call raises)."""
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        answer: bytes = channel.unary_unary(METHOD)(request, timeout=30)
    return len(answer)


def grpc_load(port: int, request: bytes, concurrency: int, seconds: float,
              host: str = "127.0.0.1") -> dict[str, float]:
    """bench/grpc_loadgen.run's figures from h2load: ``request`` (serialized ModelInferRequest)
    on ``concurrency`` streams; req/s of good answers, p50/p90/p99 ms, errors."""
    answer_size = grpc_answer_size(port, request, host)
    connections = math.ceil(concurrency / _CALLS_PER_CONNECTION)
    with tempfile.TemporaryDirectory(prefix="shoal-h2load-") as tmp:
        body, log = pathlib.Path(tmp) / "request", pathlib.Path(tmp) / "requests.log"
        body.write_bytes(b"\0" + struct.pack(">I", len(request)) + request)  # gRPC framing
        out = subprocess.run(
            ["h2load", f"-c{connections}", f"-m{math.ceil(concurrency / connections)}",
             "-D", str(max(1, round(seconds))), "-d", str(body), "--log-file", str(log),
             "-H", "content-type: application/grpc", "-H", "te: trailers",
             f"http://{host}:{port}{METHOD}"],
            capture_output=True, text=True, check=True).stdout
        return h2load_figures(out, log.read_text(), answer_size, concurrency)


def h2load_figures(output: str, log: str, answer_size: int, concurrency: int
                   ) -> dict[str, float]:
    """h2load's summary ``output`` and ``--log-file`` text (start µs, HTTP status, duration µs
    per answer) -> the figures; an answer is good if 2xx and the DATA bytes hold one message
    of ``answer_size`` bytes for it (5-byte gRPC framing each)."""
    durations, not_ok = [], 0
    for line in log.splitlines():
        _, status, micros = line.split("\t")
        durations.append(int(micros))
        not_ok += not status.startswith("2")
    data_bytes = int(_line(output, "traffic:").split(",")[-1].split("(")[1].split(")")[0])
    elapsed = float(_line(output, "finished in").split()[2].rstrip("s,"))
    answered = len(durations) - not_ok
    with_message = min(answered, round(data_bytes / (5 + answer_size)))
    durations.sort()

    def pct(p: float) -> float:
        return durations[min(len(durations) - 1, int(p * len(durations)))] / 1e3 \
            if durations else 0.0

    return {"concurrency": concurrency, "requests_per_s": with_message / elapsed,
            "p50_ms": pct(0.50), "p90_ms": pct(0.90), "p99_ms": pct(0.99),
            "errors": not_ok + answered - with_message}


def _line(output: str, prefix: str) -> str:
    return next(line for line in output.splitlines() if line.startswith(prefix))


def describe() -> dict[str, Any]:
    """Versions of the two tools, for the report."""
    def first_line(command: list[str]) -> str:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        return (done.stdout or done.stderr).strip().splitlines()[0] if available() else "absent"

    return {"wrk": first_line(["wrk", "-v"]), "h2load": first_line(["h2load", "--version"])}
