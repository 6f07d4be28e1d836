"""Closed-loop HTTP/1.1 load generator: C keep-alive connections, each sending a pre-encoded
request and waiting for the answer, for a fixed duration. Costs little CPU (raw asyncio streams,
no HTTP library), so it measures the server, not itself.

    python bench/loadgen.py --port 8000 --path /v2/models/mlp/infer --body-file req.bin \
        --header 'Inference-Header-Content-Length: 123' --concurrency 32 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import subprocess
import sys
import time
from typing import Any


def build_request(host: str, path: str, body: bytes, headers: list[str]) -> bytes:
    """JSON bodies go as application/json (FastAPI-based servers require it); bodies with the
    binary tensor extension (an Inference-Header-Content-Length header) as octet-stream."""
    binary = any(h.lower().startswith("inference-header-content-length") for h in headers)
    content_type = "application/octet-stream" if binary else "application/json"
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}",
             f"Content-Type: {content_type}", *headers, "", ""]
    return "\r\n".join(lines).encode() + body


async def read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    await reader.readexactly(length)
    return status


async def connection(host: str, port: int, request: bytes, stop_at: float,
                     latencies: list[float], errors: list[int]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            writer.write(request)
            status = await read_response(reader)
            if status == 200:
                latencies.append(time.perf_counter() - start)
            else:
                errors.append(status)
    finally:
        writer.close()


async def run(args: argparse.Namespace) -> dict[str, float]:
    with open(args.body_file, "rb") as f:
        body = f.read()
    request = build_request(f"{args.host}:{args.port}", args.path, body, args.header)
    latencies: list[float] = []
    errors: list[int] = []
    # warm-up
    await connection(args.host, args.port, request, time.perf_counter() + 0.5, [], [])
    start = time.perf_counter()
    stop_at = start + args.seconds
    await asyncio.gather(*(connection(args.host, args.port, request, stop_at, latencies, errors)
                           for _ in range(args.concurrency)))
    elapsed = time.perf_counter() - start
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1e3 if latencies else 0

    return {"concurrency": args.concurrency, "requests_per_s": len(latencies) / elapsed,
            "p50_ms": pct(0.50), "p90_ms": pct(0.90), "p99_ms": pct(0.99),
            "errors": len(errors)}


def in_subprocess(port: int, path: str, body: tuple[pathlib.Path, list[str]], concurrency: int,
                  seconds: float) -> dict[str, Any]:
    """Run this load generator in a process of its own (its own GIL, as a client would be)
    against ``path`` with ``body`` (the request file and its headers); its result line."""
    headers = [arg for header in body[1] for arg in ("--header", header)]
    out = subprocess.run(
        [sys.executable, "-m", "bench.loadgen", "--port", str(port), "--path", path,
         "--body-file", str(body[0]), *headers, "--concurrency", str(concurrency),
         "--seconds", str(seconds)],
        capture_output=True, text=True, check=True,
        cwd=pathlib.Path(__file__).resolve().parent.parent)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--path", required=True)
    parser.add_argument("--body-file", required=True)
    parser.add_argument("--header", action="append", default=[])
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    print(json.dumps(asyncio.run(run(parser.parse_args()))))


if __name__ == "__main__":
    main()
