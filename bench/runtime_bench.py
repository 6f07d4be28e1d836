"""What the one-backend benchmarks (bench/onnx_bench.py, bench/fil_bench.py) share: a shoal
backend vs an MLServer runtime serving the same model, side by side at concurrency 1 and 64 over
REST JSON (and shoal's binary tensors), plus the runtime called in process (the limit).

Each bench supplies its model, request bodies, shoal repository and MLServer model settings;
``main`` parses the common flags, runs the cells back to back, and writes bench/out/<name>.json
and the bench's marked section of bench/RESULTS.md (``--no-write``: print only).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench import servers
from bench.run import drive
from bench.sections import write_marked_section

CONCURRENCY = (1, 64)
BATCHES = (1, 8, 32)
Bodies = dict[str, tuple[pathlib.Path, list[str]]]


def time_batches(call: Callable[[Any], object], features: int,
                 seconds: float) -> dict[str, float]:
    """``call(x)`` on random FP32 [batch, features] at each of BATCHES, after 50 warm-up calls:
    rows/s and µs a call."""
    out: dict[str, float] = {}
    for batch in BATCHES:
        x = np.random.default_rng(0).standard_normal((batch, features)).astype(np.float32)
        for _ in range(50):
            call(x)
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            call(x)
            calls += 1
        elapsed = time.perf_counter() - start
        out[f"batch{batch}_rows_per_s"] = calls * batch / elapsed
        out[f"batch{batch}_call_us"] = elapsed / calls * 1e6
    return out


def in_process_line(inprocess: dict[str, float]) -> str:
    return ", ".join(f"batch {b} {inprocess[f'batch{b}_rows_per_s']:,.0f} rows/s "
                     f"({inprocess[f'batch{b}_call_us']:.0f} µs a call)" for b in BATCHES)


def start_mlserver(workdir: pathlib.Path, venv: pathlib.Path, model: str,
                   model_settings: dict[str, Any], env: dict[str, str]) -> servers.Server:
    """MLServer over ``workdir`` (which may hold the runtime's module) serving ``model`` with
    ``model_settings`` (model-settings.json), environment ``env`` added to this one's."""
    port = servers.free_port()
    (workdir / "settings.json").write_text(json.dumps({
        "http_port": port, "grpc_port": servers.free_port(),
        "metrics_port": servers.free_port(), "load_models_at_startup": True, "debug": False}))
    (workdir / model).mkdir(exist_ok=True)
    (workdir / model / "model-settings.json").write_text(json.dumps(model_settings))
    log = workdir / "mlserver.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([str(venv / "bin" / "mlserver"), "start", str(workdir)],
                                   stdout=out, stderr=subprocess.STDOUT, cwd=workdir,
                                   env={**os.environ, **env})
    servers.wait_ready(f"http://127.0.0.1:{port}/v2/models/{model}/ready", process)
    return servers.Server("mlserver", port, process, workdir, log)


@dataclass(frozen=True)
class RuntimeBench:
    name: str  # bench/out/<name>_results.json
    model: str  # the model's name on both servers
    begin: str  # RESULTS.md markers
    end: str
    bodies: Callable[[pathlib.Path], Bodies]  # written into bench/out
    in_process: Callable[[float], dict[str, float]]  # seconds per batch size
    shoal_repository: Callable[[pathlib.Path, int], pathlib.Path]  # (workdir, delay_us)
    prepare_mlserver: Callable[[pathlib.Path], None]  # installs the runtime into the venv
    mlserver: Callable[[pathlib.Path, pathlib.Path, int], servers.Server]  # workdir, venv, delay
    render: Callable[[dict[str, Any]], str]


def table_rows(results: dict[str, Any]) -> list[str]:
    """The shoal vs MLServer table, one row per cell shoal ran."""
    def cell(server: str, key: str) -> str:
        found = results.get(server, {}).get(key)
        if not found:
            return "- | -"
        return f"{found['requests_per_s']:,.0f} | {found['p99_ms']:.1f}"

    return ["| cell | shoal req/s | shoal p99 ms | MLServer req/s | MLServer p99 ms |",
            "|---|---|---|---|---|",
            *(f"| {key} | {cell('shoal', key)} | {cell('mlserver', key)} |"
              for key in results.get("shoal", {}))]


def load_note(results: dict[str, Any]) -> str:
    return (f"Load average of the machine at start / end: {results['load_average_at_start']:.1f}"
            f" / {results['load_average_at_end']:.1f} on {results['cores']} cores: above the "
            "core count the figures are indicative only.")


def main(bench: RuntimeBench, description: str) -> None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seconds", type=float, default=5.0, help="per cell")
    parser.add_argument("--delay-us", type=int, default=100,
                        help="shoal max_queue_delay_microseconds = MLServer max_batch_time")
    parser.add_argument("--mlserver-venv", default=str(servers.BENCH / ".venv-mlserver"))
    parser.add_argument("--skip-mlserver", action="store_true")
    parser.add_argument("--no-write", action="store_true",
                        help="print, leave RESULTS.md and bench/out alone")
    args = parser.parse_args()
    out = servers.BENCH / "out"
    bodies = bench.bodies(out)
    results: dict[str, Any] = {"seconds": args.seconds, "delay_us": args.delay_us,
                               "load_average_at_start": os.getloadavg()[0],
                               "cores": os.cpu_count(),
                               "inprocess": bench.in_process(min(args.seconds, 2.0))}
    print("in-process", json.dumps(results["inprocess"]), flush=True)
    with tempfile.TemporaryDirectory(prefix=f"shoal-{bench.name}-bench-") as tmp:
        root = pathlib.Path(tmp)
        (root / "shoal").mkdir()
        shoal = servers.launch_shoal(bench.shoal_repository(root / "shoal", args.delay_us),
                                     root / "shoal", [], bench.model)
        mls = None
        try:
            if not args.skip_mlserver:
                venv = servers.ensure_mlserver_venv(pathlib.Path(args.mlserver_venv))
                bench.prepare_mlserver(venv)
                (root / "mlserver").mkdir()
                mls = bench.mlserver(root / "mlserver", venv, args.delay_us)
            peers = [s for s in (shoal, mls) if s is not None]
            for server in peers:
                drive(server.port, bench.model, bodies["json"], 8, 1.0)  # warm-up
            for encoding in ("json", "binary"):
                for concurrency in CONCURRENCY:
                    key = f"{encoding}/c{concurrency}"
                    for server in peers:  # back to back: the machine drifts over minutes
                        if server.name == "mlserver" and encoding == "binary":
                            continue  # MLServer's REST has no binary tensor extension
                        cell = drive(server.port, bench.model, bodies[encoding], concurrency,
                                     args.seconds)
                        results.setdefault(server.name, {})[key] = cell
                        print(server.name, key, json.dumps(cell), flush=True)
        finally:
            shoal.stop()
            if mls is not None:
                mls.stop()
    results["load_average_at_end"] = os.getloadavg()[0]
    section = bench.render(results)
    print(section)
    if not args.no_write:
        (out / f"{bench.name}_results.json").write_text(json.dumps(results, indent=2))
        write_marked_section(servers.BENCH / "RESULTS.md", bench.begin, bench.end, section)
