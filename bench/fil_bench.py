"""Tree-model figures (issue #15): one XGBoost classifier (examples/fil_repository/xgboost_fil,
100 trees over 16 features) served by shoal's fil backend and by MLServer's own
``mlserver-xgboost`` runtime, side by side at concurrency 1 and 64 over REST JSON (and shoal's
binary tensors), and XGBoost's ``inplace_predict`` called in process (the limit). Both servers
batch (max batch 32, the same queue delay); each request is one row.

    .venv/bin/python -m bench.fil_bench [--seconds 5] [--skip-mlserver]

MLServer's venv (bench/.venv-mlserver) gets ``mlserver-xgboost`` with ``--no-deps`` plus
``xgboost-cpu`` and scikit-learn (its ``xgboost`` requirement would pull nvidia-* wheels).
Writes bench/out/fil_results.json and the section between the fil-benchmark markers of
bench/RESULTS.md (``--no-write``: print only). The section records the load average: numbers
from a busy machine are indicative only.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
from typing import Any

import numpy as np

from bench import servers
from bench.run import drive
from bench.sections import write_marked_section

BEGIN, END = "<!-- fil-benchmark:begin -->", "<!-- fil-benchmark:end -->"

FIL_EXAMPLE = servers.ROOT / "examples" / "fil_repository" / "xgboost_fil"
MODEL_FILE = FIL_EXAMPLE / "1" / "xgboost.json"
FEATURES = 16
CONCURRENCY = (1, 64)
MAX_BATCH = 32
# the fil backend's default for one CPU instance (params.default_threads)
IN_PROCESS_THREADS = max(1, len(os.sched_getaffinity(0)) - 1)


def request_bodies(out: pathlib.Path) -> dict[str, tuple[pathlib.Path, list[str]]]:
    """One row, the same bytes for both servers (JSON; no outputs named: shoal returns
    output__0 = predict_proba, MLServer its default output, predict)."""
    out.mkdir(parents=True, exist_ok=True)
    x = np.random.default_rng(0).standard_normal((1, FEATURES)).astype(np.float32)
    body = {"inputs": [{"name": "input__0", "shape": [1, FEATURES], "datatype": "FP32",
                        "data": x.reshape(-1).tolist()}]}
    (out / "fil.json").write_text(json.dumps(body))
    header = json.dumps({"inputs": [{"name": "input__0", "shape": [1, FEATURES],
                                     "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "output__0",
                                      "parameters": {"binary_data": True}}]}).encode()
    (out / "fil.bin").write_bytes(header + x.tobytes())
    return {"json": (out / "fil.json", []),
            "binary": (out / "fil.bin", [f"Inference-Header-Content-Length: {len(header)}"])}


def measure_in_process(seconds: float) -> dict[str, float]:
    """XGBoost ``inplace_predict`` in process at batch sizes 1, 8 and 32, with the thread count
    the fil backend picks on this machine for one instance."""
    import xgboost as xgb

    booster = xgb.Booster(model_file=str(MODEL_FILE))
    booster.set_param({"nthread": IN_PROCESS_THREADS})
    out: dict[str, float] = {}
    for batch in (1, 8, 32):
        x = np.random.default_rng(0).standard_normal((batch, FEATURES)).astype(np.float32)
        for _ in range(50):
            booster.inplace_predict(x)
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            booster.inplace_predict(x)
            calls += 1
        elapsed = time.perf_counter() - start
        out[f"batch{batch}_rows_per_s"] = calls * batch / elapsed
        out[f"batch{batch}_call_us"] = elapsed / calls * 1e6
    return out


def shoal_repository(workdir: pathlib.Path, delay_us: int) -> pathlib.Path:
    repo = workdir / "repo"
    shutil.copytree(FIL_EXAMPLE, repo / "xgb")
    config = repo / "xgb" / "config.pbtxt"
    config.write_text(config.read_text()
                      .replace("max_batch_size: 1024", f"max_batch_size: {MAX_BATCH}")
                      .replace("max_queue_delay_microseconds: 1000",
                               f"max_queue_delay_microseconds: {delay_us}"))
    return repo


def ensure_mlserver_xgboost(venv: pathlib.Path) -> None:
    python = str(venv / "bin" / "python")
    probe = "import mlserver_xgboost, xgboost, sklearn"
    if subprocess.run([python, "-c", probe], capture_output=True).returncode:
        pip = [python, "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "xgboost-cpu", "scikit-learn"], check=True)
        subprocess.run([*pip, "--no-deps", "mlserver-xgboost"], check=True)


def start_mlserver(workdir: pathlib.Path, venv: pathlib.Path, delay_us: int) -> servers.Server:
    workdir.mkdir(parents=True, exist_ok=True)
    port = servers.free_port()
    (workdir / "settings.json").write_text(json.dumps({
        "http_port": port, "grpc_port": servers.free_port(),
        "metrics_port": servers.free_port(), "load_models_at_startup": True, "debug": False}))
    model = workdir / "xgb"
    model.mkdir()
    shutil.copy(MODEL_FILE, model / "model.json")
    (model / "model-settings.json").write_text(json.dumps({
        "name": "xgb", "implementation": "mlserver_xgboost.XGBoostModel",
        "max_batch_size": MAX_BATCH, "max_batch_time": delay_us / 1e6,
        "parameters": {"uri": "./model.json"}}))
    log = workdir / "mlserver.log"
    # XGBoost's default thread count is OpenMP's: the same threads as shoal's instance
    env = {**os.environ, "OMP_NUM_THREADS": str(IN_PROCESS_THREADS)}
    with open(log, "wb") as out:
        process = subprocess.Popen([str(venv / "bin" / "mlserver"), "start", str(workdir)],
                                   stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env=env)
    servers.wait_ready(f"http://127.0.0.1:{port}/v2/models/xgb/ready", process)
    return servers.Server("mlserver", port, process, workdir, log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="per cell")
    parser.add_argument("--delay-us", type=int, default=100,
                        help="shoal max_queue_delay_microseconds = MLServer max_batch_time")
    parser.add_argument("--mlserver-venv", default=str(servers.BENCH / ".venv-mlserver"))
    parser.add_argument("--skip-mlserver", action="store_true")
    parser.add_argument("--no-write", action="store_true",
                        help="print, leave RESULTS.md and bench/out alone")
    args = parser.parse_args()
    out = servers.BENCH / "out"
    bodies = request_bodies(out)
    results: dict[str, Any] = {"seconds": args.seconds, "delay_us": args.delay_us,
                               "load_average_at_start": os.getloadavg()[0],
                               "cores": os.cpu_count(),
                               "inprocess": measure_in_process(min(args.seconds, 2.0))}
    print("in-process", json.dumps(results["inprocess"]), flush=True)
    with tempfile.TemporaryDirectory(prefix="shoal-fil-bench-") as tmp:
        root = pathlib.Path(tmp)
        (root / "shoal").mkdir()
        shoal = servers.launch_shoal(shoal_repository(root / "shoal", args.delay_us),
                                     root / "shoal", [], "xgb")
        mls = None
        try:
            if not args.skip_mlserver:
                venv = servers.ensure_mlserver_venv(pathlib.Path(args.mlserver_venv))
                ensure_mlserver_xgboost(venv)
                mls = start_mlserver(root / "mlserver", venv, args.delay_us)
            peers = [s for s in (shoal, mls) if s is not None]
            for server in peers:
                drive(server.port, "xgb", bodies["json"], 8, 1.0)  # warm-up
            for encoding in ("json", "binary"):
                for concurrency in CONCURRENCY:
                    key = f"{encoding}/c{concurrency}"
                    for server in peers:  # back to back: the machine drifts over minutes
                        if server.name == "mlserver" and encoding == "binary":
                            continue  # MLServer's REST has no binary tensor extension
                        cell = drive(server.port, "xgb", bodies[encoding], concurrency,
                                     args.seconds)
                        results.setdefault(server.name, {})[key] = cell
                        print(server.name, key, json.dumps(cell), flush=True)
        finally:
            shoal.stop()
            if mls is not None:
                mls.stop()
    results["load_average_at_end"] = os.getloadavg()[0]
    section = render(results)
    print(section)
    if not args.no_write:
        (out / "fil_results.json").write_text(json.dumps(results, indent=2))
        write_marked_section(servers.BENCH / "RESULTS.md", BEGIN, END, section)


def render(results: dict[str, Any]) -> str:
    def cell(server: str, key: str) -> str:
        found = results.get(server, {}).get(key)
        if not found:
            return "- | -"
        return f"{found['requests_per_s']:,.0f} | {found['p99_ms']:.1f}"

    inprocess = results["inprocess"]
    lines = [
        BEGIN,
        "## Tree models: shoal's fil backend vs MLServer's mlserver-xgboost vs in process",
        "",
        "`.venv/bin/python -m bench.fil_bench` (seconds per cell: "
        f"{results['seconds']}, queue delay {results['delay_us']} µs). One XGBoost classifier "
        "(examples/fil_repository/xgboost_fil: 100 trees of depth 6, 16 features), one row per "
        "request, on shoal's fil backend (output__0 = predict_proba) and on MLServer 1.7.1's "
        "mlserver-xgboost runtime (its default output, predict); both batch up to "
        f"{MAX_BATCH} with the same delay and predict with {IN_PROCESS_THREADS} thread(s). "
        "MLServer's REST has no binary tensors. Load average "
        f"of the machine at start / end: {results['load_average_at_start']:.1f} / "
        f"{results['load_average_at_end']:.1f} on {results['cores']} cores: above the core "
        "count the figures are indicative only.",
        "",
        "| cell | shoal req/s | shoal p99 ms | MLServer req/s | MLServer p99 ms |",
        "|---|---|---|---|---|",
        *(f"| {key} | {cell('shoal', key)} | {cell('mlserver', key)} |"
          for key in results.get("shoal", {})),
        "",
        f"XGBoost inplace_predict in process (the limit; {IN_PROCESS_THREADS} thread(s), the "
        "fil backend's default here, and MLServer's through OMP_NUM_THREADS): "
        + ", ".join(f"batch {b} {inprocess[f'batch{b}_rows_per_s']:,.0f} rows/s "
                    f"({inprocess[f'batch{b}_call_us']:.0f} µs a call)" for b in (1, 8, 32))
        + ".",
        END,
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
