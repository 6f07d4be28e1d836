"""The side-by-side benchmark (issue: performance). One command, from the repository root:

    make bench            # = .venv/bin/python bench/run.py

Starts and stops every server itself, drives each with the same closed-loop generators
(wrk over HTTP, h2load over gRPC, through bench/native_loadgen.py; the Python generators
bench/loadgen.py and bench/grpc_loadgen.py where those are not installed or with
``--python-loadgen``) and the same request bytes, measures the in-process limits, and
writes bench/RESULTS.md, the curves (bench/serving_curves.png) and bench/out/results.json.
Two models: the realistic MLP of bench/realistic.py at both servers' defaults (JSON, binary,
gRPC at c = 1, 16, 64, 256; the issue's targets computed from it) and the tiny example MLP (a
few cells: per-request cost). The realistic model's c=64 JSON and gRPC cells run once more
with the Python generators, so the report shows what the generator's own CPU costs each
server. Everything runs on this machine; compare the ratios within one run, not absolute
numbers across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import platform
import tempfile
import time
from typing import Any

import numpy as np

from bench import curves, grpc_loadgen, loadgen, native_loadgen, realistic, report, servers
from bench.inprocess import measure_in_process
from bench.targets import realistic_targets

WORKLOAD_CONCURRENCY = (1, 16, 64, 256)
TRANSPORTS = ("json", "binary", "grpc")
PYTHON_LOADGEN_CELLS = (("json", 64), ("grpc", 64))  # the generator's cost, shown
TINY_CELLS = (("json", 1), ("json", 64), ("binary", 64))
CURVES = "serving_curves.png"  # under bench/, linked from RESULTS.md


def sample_row() -> np.ndarray:
    """The one FP32 [1, 256] row every request carries (both MLPs take 256 features)."""
    return np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32)


def bodies(out: pathlib.Path) -> dict[str, tuple[pathlib.Path, list[str]]]:
    """Request files shared by every server: (path, extra headers)."""
    out.mkdir(parents=True, exist_ok=True)
    x = sample_row()
    json_body = json.dumps({"inputs": [{"name": "INPUT__0", "shape": [1, 256],
                                        "datatype": "FP32", "data": x.reshape(-1).tolist()}]})
    (out / "mlp.json").write_text(json_body)
    header = json.dumps({"inputs": [{"name": "INPUT__0", "shape": [1, 256], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "OUTPUT__0",
                                      "parameters": {"binary_data": True}}]}).encode()
    (out / "mlp.bin").write_bytes(header + x.tobytes())
    ident = np.arange(16, dtype=np.float32).reshape(1, 16)
    identity = {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                "data": ident.reshape(-1).tolist()}
    (out / "identity.json").write_text(json.dumps({"inputs": [identity]}))
    return {
        "json": (out / "mlp.json", []),
        "binary": (out / "mlp.bin", [f"Inference-Header-Content-Length: {len(header)}"]),
        "identity": (out / "identity.json", []),
    }


# wrk / h2load when installed (bench/native_loadgen.py says why); main() may turn this off
NATIVE = {"on": native_loadgen.available()}


def drive(port: int, model: str, body: tuple[pathlib.Path, list[str]], concurrency: int,
          seconds: float, python: bool = False) -> dict[str, float]:
    """One closed-loop HTTP cell: wrk, or bench/loadgen.py when ``python`` or wrk is absent."""
    path = f"/v2/models/{model}/infer"
    if NATIVE["on"] and not python:
        return native_loadgen.http(port, path, body, concurrency, seconds)
    args = argparse.Namespace(host="127.0.0.1", port=port, path=path,
                              body_file=str(body[0]), header=body[1], concurrency=concurrency,
                              seconds=seconds)
    return asyncio.run(loadgen.run(args))


def shoal_stats(server: servers.Server, model: str) -> dict[str, Any]:
    import urllib.request

    url = f"http://127.0.0.1:{server.port}/v2/models/{model}/stats"
    with urllib.request.urlopen(url) as r:
        stats = json.load(r)["model_stats"][0]
    return {
        "inference_count": stats["inference_count"], "execution_count": stats["execution_count"],
        "execute_ns": sum(b["compute_infer"]["ns"] for b in stats["batch_stats"]),
        "worker_ns": sum(b["compute_infer"]["ns"] + b["compute_input"]["ns"]
                         + b["compute_output"]["ns"] for b in stats["batch_stats"]),
    }


def load(server: servers.Server, model: str, encoding: str,
         request_bodies: dict[str, Any], concurrency: int, seconds: float,
         python: bool = False) -> dict[str, float]:
    """One closed-loop cell over HTTP (json / binary / identity bodies) or gRPC (h2load, or
    bench/grpc_loadgen.py when ``python`` or h2load is absent)."""
    if encoding == "grpc":
        request = grpc_loadgen.infer_request(model, "INPUT__0", sample_row())
        if NATIVE["on"] and not python:
            return native_loadgen.grpc_load(server.extra["grpc"], request, concurrency,
                                            seconds)
        return asyncio.run(grpc_loadgen.run(server.extra["grpc"], request, concurrency,
                                            seconds))
    return drive(server.port, model, request_bodies[encoding], concurrency, seconds, python)


def saturation(server: servers.Server, model: str, encoding: str,
               request_bodies: dict[str, Any], concurrency: int,
               seconds: float) -> dict[str, Any]:
    """Load plus the worker's view: share of wall time in backend.execute, mean batch."""
    before, start = shoal_stats(server, model), time.perf_counter()
    result: dict[str, Any] = dict(load(server, model, encoding, request_bodies, concurrency,
                                       seconds))
    after, wall = shoal_stats(server, model), time.perf_counter() - start
    executions = after["execution_count"] - before["execution_count"]
    rows = after["inference_count"] - before["inference_count"]
    result["mean_batch"] = rows / max(1, executions)
    result["execute_share"] = (after["execute_ns"] - before["execute_ns"]) / 1e9 / wall
    result["worker_busy_share"] = (after["worker_ns"] - before["worker_ns"]) / 1e9 / wall
    return result


def measure_cell(server: servers.Server, model: str, encoding: str,
                 request_bodies: dict[str, Any], concurrency: int, seconds: float
                 ) -> dict[str, Any]:
    if server.name == "shoal" and model != "identity16" and concurrency >= 64:
        return saturation(server, model, encoding, request_bodies, concurrency, seconds)
    return dict(load(server, model, encoding, request_bodies, concurrency, seconds))


def run_side_by_side(shoal: servers.Server, mls: servers.Server | None,
                     request_bodies: dict[str, Any], seconds: float,
                     cells: list[tuple[str, str, int]]
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every cell (model, encoding, clients) runs on shoal and then, right after, on MLServer
    (both servers up, the idle one costing nothing): the machine's speed drifts over minutes,
    so cells measured back to back compare fairly, where "all of shoal, then all of MLServer"
    would not."""
    results: dict[str, dict[str, Any]] = {"shoal": {}, "mlserver": {}}
    peers = [s for s in (shoal, mls) if s is not None]
    for model in sorted({m for m, _, _ in cells if m != "identity16"}):
        for server in peers:
            drive(server.port, model, request_bodies["json"], 8, 2.0)  # warm-up
    for model, encoding, c in cells:
        key = f"{encoding}/c{c}"
        for server in peers:
            if server.name == "mlserver" and encoding == "binary":
                continue  # MLServer's REST has no binary tensor extension: JSON is its best
            results[server.name][key] = measure_cell(server, model, encoding, request_bodies,
                                                     c, seconds)
            print(server.name, model, key, json.dumps(results[server.name][key]), flush=True)
    return results["shoal"], results["mlserver"]


def python_loadgen_cells(shoal: servers.Server, mls: servers.Server | None,
                         request_bodies: dict[str, Any], seconds: float
                         ) -> dict[str, dict[str, Any]]:
    """The realistic model's PYTHON_LOADGEN_CELLS again with the Python generators (shoal, then
    MLServer right after): what the generator's own CPU costs each server."""
    cells: dict[str, dict[str, Any]] = {"shoal": {}, "mlserver": {}}
    for encoding, c in PYTHON_LOADGEN_CELLS:
        for server in (s for s in (shoal, mls) if s is not None):
            cells[server.name][f"{encoding}/c{c}"] = result = dict(load(
                server, realistic.NAME, encoding, request_bodies, c, seconds, python=True))
            print(server.name, "python loadgen", f"{encoding}/c{c}", json.dumps(result),
                  flush=True)
    return cells


def policy_line(server: servers.Server, model: str) -> str:
    """What shoal's thread policy gave ``model`` (its log line, shortened)."""
    for line in server.log.read_text(errors="replace").splitlines():
        if f"model '{model}' version 1: default" in line:
            return line.split(f"model '{model}' version 1: ", 1)[1]
    return "not logged"


def mlserver_torch_threads(venv: pathlib.Path) -> str:
    """torch's default intra-op thread count in MLServer's environment (what its inference
    process runs when the runtime sets none)."""
    import subprocess

    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import torch; print(torch.get_num_threads())"],
                         capture_output=True, text=True, check=False).stdout.strip()
    return out or "?"


def soak(server: servers.Server, body: tuple[pathlib.Path, list[str]], seconds: float
         ) -> dict[str, Any]:
    drive(server.port, "mlp", body, 64, 5.0)  # reach steady state before the first sample
    before = server.rss_mib()
    result = drive(server.port, "mlp", body, 64, seconds)
    after = server.rss_mib()
    result["rss_mib"] = {k: [round(before.get(k, 0.0), 1), round(v, 1)] for k, v in after.items()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=8.0, help="per workload")
    parser.add_argument("--soak-seconds", type=float, default=60.0)
    parser.add_argument("--delay-us", type=int, default=100,
                        help="the tiny MLP's max_queue_delay_microseconds = MLServer "
                        "max_batch_time (the realistic model always uses 1000)")
    parser.add_argument("--mlserver-venv", default=str(servers.BENCH / ".venv-mlserver"))
    parser.add_argument("--skip-mlserver", action="store_true")
    parser.add_argument("--python-loadgen", action="store_true",
                        help="drive every cell with bench/loadgen.py and bench/grpc_loadgen.py "
                        "even where wrk and h2load are installed")
    args = parser.parse_args()
    NATIVE["on"] = NATIVE["on"] and not args.python_loadgen

    out = servers.BENCH / "out"
    request_bodies = bodies(out)
    results: dict[str, Any] = {"delay_us": args.delay_us, "seconds": args.seconds,
                               "machine": report.machine(), "versions": report.versions(args),
                               "load_average": [os.getloadavg()[0]],
                               "tiny_cells": [f"{e}/c{c}" for e, c in TINY_CELLS],
                               "loadgen": native_loadgen.describe() if NATIVE["on"] else None}
    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as tmp:
        root = pathlib.Path(tmp)
        model_path = realistic.build(root / "mlp_large.pt")
        print("in-process limits ...", flush=True)
        results["inprocess"] = measure_in_process(servers.EXAMPLES / "mlp" / "1" / "model.pt")
        real: dict[str, Any] = {"delay_us": realistic.DELAY_US,
                                "concurrency": list(WORKLOAD_CONCURRENCY),
                                "inprocess": measure_in_process(model_path)}
        results["realistic"] = real
        print(json.dumps(results["inprocess"]), json.dumps(real["inprocess"]), flush=True)
        shoal = servers.start_shoal(root / "shoal", args.delay_us, realistic=True)
        real["shoal_policy"] = policy_line(shoal, realistic.NAME)
        mls = None
        try:
            if not args.skip_mlserver:
                venv = servers.ensure_mlserver_venv(pathlib.Path(args.mlserver_venv))
                real["mlserver_torch_threads"] = mlserver_torch_threads(venv)
                mls = servers.start_mlserver(root / "mlserver", venv, args.delay_us,
                                             realistic=model_path)
            real["shoal"], real["mlserver"] = run_side_by_side(
                shoal, mls, request_bodies, args.seconds,
                [(realistic.NAME, enc, c) for enc in TRANSPORTS for c in WORKLOAD_CONCURRENCY])
            if NATIVE["on"]:
                real["python_loadgen"] = python_loadgen_cells(shoal, mls, request_bodies,
                                                              args.seconds)
            results["shoal"], results["mlserver"] = run_side_by_side(
                shoal, mls, request_bodies, args.seconds,
                [*(("mlp", enc, c) for enc, c in TINY_CELLS), ("identity16", "identity", 1)])
            if mls is not None:
                mls.stop()
                mls = None
            results["soak"] = soak(shoal, request_bodies["binary"], args.soak_seconds)
            results["soak_seconds"] = args.soak_seconds
            print("soak", json.dumps(results["soak"]), flush=True)
        finally:
            shoal.stop()
            if mls is not None:
                mls.stop()
        two = servers.start_shoal(root / "shoal2", args.delay_us, http_workers=2)
        try:
            drive(two.port, "mlp", request_bodies["json"], 8, 2.0)
            results["http_workers_2"] = {
                f"{enc}/c64": drive(two.port, "mlp", request_bodies[enc], 64, args.seconds)
                for enc in ("json", "binary")}
            print("http-workers=2", json.dumps(results["http_workers_2"]), flush=True)
        finally:
            two.stop()
    results["load_average"].append(os.getloadavg()[0])
    real["curves"] = CURVES
    curves.draw({"shoal": real["shoal"], "mlserver": real.get("mlserver", {})},
                WORKLOAD_CONCURRENCY, "TorchScript MLP 256→1024→1024→16 at defaults, dynamic "
                "batching 32 / 1 ms", servers.BENCH / CURVES)
    print("targets (realistic model):", flush=True)
    for target in realistic_targets(real["shoal"], real.get("mlserver", {}), real["inprocess"]):
        print(target.line(), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    command = "make bench" + ("" if args.seconds == 8.0 and args.soak_seconds == 60.0 and
                              args.delay_us == 100 and not args.python_loadgen else
                              f" BENCH_ARGS='--seconds {args.seconds} --soak-seconds "
                              f"{args.soak_seconds} --delay-us {args.delay_us}"
                              + (" --python-loadgen'" if args.python_loadgen else "'"))
    report.write_results(results, servers.BENCH / "RESULTS.md", command, platform.node())
    print("wrote bench/RESULTS.md and bench/" + CURVES, flush=True)


if __name__ == "__main__":
    main()
