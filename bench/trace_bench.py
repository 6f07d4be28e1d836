"""What tracing costs: requests/s and p50/p99 latency of a small model with tracing off, at
``trace_rate`` 1000 (Triton's default rate) and at ``trace_rate`` 1 (every request traced).
From the repository root:

    make bench-trace      # = .venv/bin/python -m bench.trace_bench

One ``shoal serve`` per setting, each over a copy of examples/model_repository/identity_fp32 (a
python model, FP32 [16], dynamic batching), started with ``--trace-config`` in triton mode
(``level=TIMESTAMPS``, ``log-frequency=1000``: a file every 1000 traces, as a long-running
server would write them). The same closed loop drives each (bench/loadgen.py: C keep-alive
HTTP/1.1 connections, a JSON request, ``--seconds`` after a short warm-up). Traces written are
counted from the files after the server stopped.

Writes the section between the trace-benchmark markers of bench/RESULTS.md (the rest of the file
is kept) and bench/out/trace_results.json; ``--no-write`` only prints.
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
from collections.abc import Iterator
from typing import Any

from bench import loadgen, servers
from bench.sections import write_marked_section

MODEL = "identity_fp32"
BEGIN, END = "<!-- trace-benchmark:begin -->", "<!-- trace-benchmark:end -->"
RESULTS = servers.BENCH / "RESULTS.md"
OUT = servers.BENCH / "out" / "trace_results.json"
# (label, --trace-config flags beyond the file)
SETTINGS: list[tuple[str, list[str]]] = [
    ("tracing off", ["level=OFF"]),
    ("trace_rate 1000", ["level=TIMESTAMPS", "rate=1000"]),
    ("trace_rate 1", ["level=TIMESTAMPS", "rate=1"]),
]


@contextlib.contextmanager
def shoal_server(repo: pathlib.Path, workdir: pathlib.Path, trace_flags: list[str]
                 ) -> Iterator[servers.Server]:
    trace_file = workdir / "trace.json"
    server = servers.launch_shoal(
        repo, workdir, [f"--trace-config=triton,file={trace_file}",
                        "--trace-config=triton,log-frequency=1000",
                        *(f"--trace-config={flag}" for flag in trace_flags)], MODEL)
    process = server.process
    try:
        yield server
    finally:
        if process.poll() is None:  # stop, keep the workdir (the trace files are counted)
            process.terminate()
            process.wait(timeout=60)


def count_traces(workdir: pathlib.Path) -> int:
    """Traces in every trace file the server wrote (one header record each)."""
    total = 0
    for path in workdir.glob("trace.json*"):
        with contextlib.suppress(ValueError, OSError):
            total += sum(1 for r in json.loads(path.read_text()) if "model_name" in r)
    return total


def run_setting(label: str, flags: list[str], args: argparse.Namespace,
                root: pathlib.Path, body_file: pathlib.Path) -> dict[str, Any]:
    repo = root / "repo"
    workdir = root / label.replace(" ", "_")
    workdir.mkdir()
    with shoal_server(repo, workdir, flags) as server:
        load = argparse.Namespace(host="127.0.0.1", port=server.port,
                                  path=f"/v2/models/{MODEL}/infer", body_file=str(body_file),
                                  header=[], concurrency=args.concurrency, seconds=args.seconds)
        result = asyncio.run(loadgen.run(load))
    result.update(setting=label, trace_config=flags, traces_written=count_traces(workdir))
    print(json.dumps(result), flush=True)
    return result


def shoal_revision() -> str:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.run(["git", "-C", str(servers.ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    return "unknown"


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shoal-trace-bench-") as tmp:
        root = pathlib.Path(tmp)
        shutil.copytree(servers.EXAMPLES / MODEL, root / "repo" / MODEL)
        body_file = root / "request.json"
        body_file.write_text(json.dumps({"inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}))
        rows = [run_setting(label, flags, args, root, body_file) for label, flags in SETTINGS]
    return {"date": datetime.date.today().isoformat(), "revision": shoal_revision(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                       f"Python {platform.python_version()}",
            "concurrency": args.concurrency, "seconds": args.seconds, "rows": rows}


def render(results: dict[str, Any], command: str) -> str:
    off = results["rows"][0]["requests_per_s"] or 1.0
    lines = [
        BEGIN,
        "## Tracing overhead",
        "",
        f"`{command}` ({results['date']}, shoal {results['revision']}, {results['machine']}): "
        f"{results['concurrency']} closed-loop HTTP/1.1 clients for {results['seconds']:g} s "
        f"against `{MODEL}` (python, FP32 [16], dynamic batching), one server per setting, "
        "`--trace-config triton,file=...,log-frequency=1000 level=TIMESTAMPS`.",
        "",
        "| setting | requests/s | vs off | p50 ms | p99 ms | errors | traces written |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results["rows"]:
        lines.append(f"| {row['setting']} | {row['requests_per_s']:.0f} | "
                     f"{row['requests_per_s'] / off:.2f} | {row['p50_ms']:.2f} | "
                     f"{row['p99_ms']:.2f} | {row['errors']} | {row['traces_written']} |")
    lines.append(END)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=8, help="closed-loop clients")
    parser.add_argument("--seconds", type=float, default=10.0, help="load per setting")
    parser.add_argument("--no-write", action="store_true",
                        help="print, leave RESULTS.md and bench/out alone")
    args = parser.parse_args()
    results = run(args)
    command = "make bench-trace" if len(sys.argv) == 1 else \
        "python -m bench.trace_bench " + " ".join(sys.argv[1:])
    section = render(results, command)
    print(section)
    if not args.no_write:
        OUT.parent.mkdir(exist_ok=True)
        OUT.write_text(json.dumps(results, indent=2))
        write_marked_section(RESULTS, BEGIN, END, section)


if __name__ == "__main__":
    main()
