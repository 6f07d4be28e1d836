"""What the response cache buys and costs: requests/s and p50/p99 of the example TorchScript MLP
(examples/model_repository/mlp, dynamic batching, 1 ms delay) over HTTP JSON with the cache off
and with every request a hit, and the cache's own per-request cost (lookup + extract per hit,
lookup + insertion per miss) from the statistics. From the repository root:

    make bench-cache      # = .venv/bin/python -m bench.response_cache_bench: 10 s per cell

One ``shoal serve`` per setting over a copy of the MLP; "cache on" adds
``response_cache { enable: true }`` to its config and starts the server with
``--cache-config local,size=64MiB``. The closed loop (bench/loadgen.py: C keep-alive HTTP/1.1
connections) sends one body over and over, so with the cache on every timed request is a hit
(the warm-up's first request is the miss). Then ``--distinct`` different bodies are sent one
at a time and the statistics' ``cache_miss`` / ``cache_hit`` give the mean cost of a miss and a
hit inside the frontend.

Writes the section between the response-cache markers of bench/RESULTS.md (the rest of the
file is kept) and bench/out/response_cache_results.json; ``--no-write`` only prints.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import httpx
import numpy as np

from bench import loadgen, servers
from bench.sections import write_marked_section

MODEL = "mlp"
CACHE_BYTES = 64 * 1024 * 1024
BEGIN, END = "<!-- response-cache-benchmark:begin -->", "<!-- response-cache-benchmark:end -->"
RESULTS = servers.BENCH / "RESULTS.md"
OUT = servers.BENCH / "out" / "response_cache_results.json"


def body(seed: int) -> bytes:
    row = np.random.default_rng(seed).standard_normal(256).astype(np.float32)
    return json.dumps({"inputs": [{"name": "INPUT__0", "shape": [1, 256], "datatype": "FP32",
                                   "data": [float(x) for x in row]}]}).encode()


def repository(root: pathlib.Path, cached: bool) -> pathlib.Path:
    repo = root / ("repo-cached" if cached else "repo-plain")
    shutil.copytree(servers.EXAMPLES / MODEL, repo / MODEL)
    if cached:
        config = repo / MODEL / "config.pbtxt"
        config.write_text(config.read_text() + "\nresponse_cache { enable: true }\n")
    return repo


def cache_costs(port: int, distinct: int) -> dict[str, float]:
    """Mean ns of a miss and of a hit: ``distinct`` new bodies, each sent twice."""
    url = f"http://127.0.0.1:{port}/v2/models/{MODEL}"
    with httpx.Client(timeout=30) as client:
        before = client.get(f"{url}/stats").json()["model_stats"][0]["inference_stats"]
        for seed in range(1, distinct + 1):
            for _ in range(2):
                client.post(f"{url}/infer", content=body(10_000 + seed)).raise_for_status()
        after = client.get(f"{url}/stats").json()["model_stats"][0]["inference_stats"]

    def mean(kind: str) -> float:
        count = after[kind]["count"] - before[kind]["count"]
        return (after[kind]["ns"] - before[kind]["ns"]) / count if count else 0.0

    return {"miss_us": mean("cache_miss") / 1000, "hit_us": mean("cache_hit") / 1000}


def run_setting(cached: bool, args: argparse.Namespace, root: pathlib.Path,
                body_file: pathlib.Path) -> list[dict[str, Any]]:
    label = "cache on (hits)" if cached else "cache off"
    workdir = root / ("on" if cached else "off")
    workdir.mkdir()
    flags = [f"--cache-config=local,size={CACHE_BYTES}"] if cached else []
    server = servers.launch_shoal(repository(root, cached), workdir, flags, MODEL)
    rows: list[dict[str, Any]] = []
    try:
        for concurrency in args.concurrency:
            load = argparse.Namespace(host="127.0.0.1", port=server.port,
                                      path=f"/v2/models/{MODEL}/infer",
                                      body_file=str(body_file), header=[],
                                      concurrency=concurrency, seconds=args.seconds)
            row: dict[str, Any] = {**asyncio.run(loadgen.run(load)), "setting": label}
            print(json.dumps(row), flush=True)
            rows.append(row)
        if cached:
            costs = cache_costs(server.port, args.distinct)
            print(json.dumps(costs), flush=True)
            for row in rows:
                row.update(costs)
    finally:
        if server.process.poll() is None:
            server.process.terminate()
            server.process.wait(timeout=60)
    return rows


def shoal_revision() -> str:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.run(["git", "-C", str(servers.ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    return "unknown"


def load_average() -> str:
    with contextlib.suppress(OSError):
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    return "unknown"


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shoal-cache-bench-") as tmp:
        root = pathlib.Path(tmp)
        body_file = root / "request.json"
        body_file.write_bytes(body(0))
        rows = [*run_setting(False, args, root, body_file),
                *run_setting(True, args, root, body_file)]
    return {"date": datetime.date.today().isoformat(), "revision": shoal_revision(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                       f"Python {platform.python_version()}",
            "load_average": load_average(), "seconds": args.seconds,
            "distinct": args.distinct, "rows": rows}


def render(results: dict[str, Any], command: str) -> str:
    off = {r["concurrency"]: r for r in results["rows"] if r["setting"] == "cache off"}
    hits = [r for r in results["rows"] if r["setting"] != "cache off"]
    lines = [
        BEGIN,
        "## Response cache",
        "",
        f"`{command}` ({results['date']}, shoal {results['revision']}, {results['machine']}, "
        f"load average {results['load_average']} after the run): closed-loop HTTP/1.1 JSON "
        f"clients for {results['seconds']:g} s per cell against `{MODEL}` (TorchScript "
        "256→64→16, dynamic batching 1 ms), one server per setting; with the cache on every "
        "timed request repeats one body (all hits).",
        "",
        "| setting | clients | requests/s | vs off | p50 ms | p99 ms | errors |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results["rows"]:
        base = off.get(row["concurrency"], row)["requests_per_s"] or 1.0
        lines.append(f"| {row['setting']} | {row['concurrency']} | "
                     f"{row['requests_per_s']:.0f} | {row['requests_per_s'] / base:.2f} | "
                     f"{row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['errors']} |")
    if hits:
        lines += ["", f"Inside the frontend ({results['distinct']} new bodies, each sent "
                  f"twice, one at a time): a miss costs {hits[0]['miss_us']:.1f} µs (key + "
                  f"copy of the answer), a hit {hits[0]['hit_us']:.1f} µs (key + lookup + "
                  "building the answer), from the statistics' `cache_miss` / `cache_hit`."]
    lines.append(END)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64],
                        help="closed-loop clients per cell")
    parser.add_argument("--seconds", type=float, default=10.0, help="load per cell")
    parser.add_argument("--distinct", type=int, default=200,
                        help="new bodies for the per-request cost")
    parser.add_argument("--no-write", action="store_true",
                        help="print, leave RESULTS.md and bench/out alone")
    args = parser.parse_args()
    results = run(args)
    command = "make bench-cache" if len(sys.argv) == 1 else \
        "python -m bench.response_cache_bench " + " ".join(sys.argv[1:])
    section = render(results, command)
    print(section)
    if not args.no_write:
        OUT.parent.mkdir(exist_ok=True)
        OUT.write_text(json.dumps(results, indent=2))
        write_marked_section(RESULTS, BEGIN, END, section)


if __name__ == "__main__":
    main()
