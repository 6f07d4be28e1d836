"""ONNX figures (issue #15): the benchmark MLP as ONNX (examples/onnx_repository/mlp_onnx) served
by shoal's onnxruntime backend and by MLServer with a small custom ONNX Runtime runtime
(bench/mlserver/onnx_runtime.py), side by side at concurrency 1 and 64, and ONNX Runtime called
in process (the limit). Both servers batch (max batch 32, the same queue delay) and run one
intra-op thread.

    .venv/bin/python -m bench.onnx_bench [--seconds 5] [--skip-mlserver]

Writes bench/out/onnx_results.json and the section between the onnx-benchmark markers of
bench/RESULTS.md (``--no-write``: print only). Compare ratios within one run on a quiet machine;
the section records the load average, since numbers from a busy machine are indicative only.
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
from bench.run import bodies, drive
from bench.sections import write_marked_section

BEGIN, END = "<!-- onnx-benchmark:begin -->", "<!-- onnx-benchmark:end -->"

ONNX_EXAMPLE = servers.ROOT / "examples" / "onnx_repository" / "mlp_onnx"
CONCURRENCY = (1, 64)


def measure_in_process(seconds: float) -> dict[str, float]:
    """ONNX Runtime in process, one intra-op thread, at batch sizes 1, 8 and 32."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(ONNX_EXAMPLE / "1" / "model.onnx"), sess_options=options,
                                   providers=["CPUExecutionProvider"])
    out: dict[str, float] = {}
    for batch in (1, 8, 32):
        x = np.random.default_rng(0).standard_normal((batch, 256)).astype(np.float32)
        for _ in range(50):
            session.run(None, {"INPUT__0": x})
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            session.run(None, {"INPUT__0": x})
            calls += 1
        elapsed = time.perf_counter() - start
        out[f"batch{batch}_rows_per_s"] = calls * batch / elapsed
        out[f"batch{batch}_call_us"] = elapsed / calls * 1e6
    return out


def shoal_repository(workdir: pathlib.Path, delay_us: int) -> pathlib.Path:
    repo = workdir / "repo"
    shutil.copytree(ONNX_EXAMPLE, repo / "mlp")  # served as "mlp": the shared request bodies
    config = repo / "mlp" / "config.pbtxt"
    config.write_text(config.read_text().replace(
        "max_queue_delay_microseconds: 1000", f"max_queue_delay_microseconds: {delay_us}"))
    return repo


def start_mlserver(workdir: pathlib.Path, venv: pathlib.Path, delay_us: int) -> servers.Server:
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(servers.BENCH / "mlserver" / "onnx_runtime.py", workdir / "onnx_runtime.py")
    port = servers.free_port()
    (workdir / "settings.json").write_text(json.dumps({
        "http_port": port, "grpc_port": servers.free_port(),
        "metrics_port": servers.free_port(), "load_models_at_startup": True, "debug": False}))
    model = workdir / "mlp"
    model.mkdir()
    (model / "model-settings.json").write_text(json.dumps({
        "name": "mlp", "implementation": "onnx_runtime.OnnxRuntime",
        "max_batch_size": 32, "max_batch_time": delay_us / 1e6,
        "parameters": {"uri": str(ONNX_EXAMPLE / "1" / "model.onnx")}}))
    log = workdir / "mlserver.log"
    env = {**os.environ, "PYTHONPATH": str(workdir)}
    with open(log, "wb") as out:
        process = subprocess.Popen([str(venv / "bin" / "mlserver"), "start", str(workdir)],
                                   stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env=env)
    servers.wait_ready(f"http://127.0.0.1:{port}/v2/models/mlp/ready", process)
    return servers.Server("mlserver", port, process, workdir, log)


def ensure_onnxruntime(venv: pathlib.Path) -> None:
    python = str(venv / "bin" / "python")
    if subprocess.run([python, "-c", "import onnxruntime"], capture_output=True).returncode:
        subprocess.run([python, "-m", "pip", "install", "-q", "onnxruntime"], check=True)


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
    request_bodies = bodies(out)
    results: dict[str, Any] = {"seconds": args.seconds, "delay_us": args.delay_us,
                               "load_average_at_start": os.getloadavg()[0],
                               "cores": os.cpu_count(),
                               "inprocess": measure_in_process(min(args.seconds, 2.0))}
    print("in-process", json.dumps(results["inprocess"]), flush=True)
    with tempfile.TemporaryDirectory(prefix="shoal-onnx-bench-") as tmp:
        root = pathlib.Path(tmp)
        (root / "shoal").mkdir()
        shoal = servers.launch_shoal(shoal_repository(root / "shoal", args.delay_us),
                                     root / "shoal", [], "mlp")
        mls = None
        try:
            if not args.skip_mlserver:
                venv = servers.ensure_mlserver_venv(pathlib.Path(args.mlserver_venv))
                ensure_onnxruntime(venv)
                mls = start_mlserver(root / "mlserver", venv, args.delay_us)
            peers = [s for s in (shoal, mls) if s is not None]
            for server in peers:
                drive(server.port, "mlp", request_bodies["json"], 8, 1.0)  # warm-up
            for encoding in ("json", "binary"):
                for concurrency in CONCURRENCY:
                    key = f"{encoding}/c{concurrency}"
                    for server in peers:  # back to back: the machine drifts over minutes
                        if server.name == "mlserver" and encoding == "binary":
                            continue  # MLServer's REST has no binary tensor extension
                        cell = drive(server.port, "mlp", request_bodies[encoding],
                                     concurrency, args.seconds)
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
        (out / "onnx_results.json").write_text(json.dumps(results, indent=2))
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
        "## ONNX Runtime: shoal's onnxruntime backend vs MLServer vs in process",
        "",
        "`.venv/bin/python -m bench.onnx_bench` (seconds per cell: "
        f"{results['seconds']}, queue delay {results['delay_us']} µs). The benchmark MLP as ONNX "
        "(examples/onnx_repository/mlp_onnx, 256 -> 64 -> 16) on shoal's onnxruntime backend and "
        "on MLServer with a custom ONNX Runtime runtime (bench/mlserver/onnx_runtime.py); both "
        "batch up to 32 with the same delay and run one intra-op thread. MLServer's REST has no "
        "binary tensors. Load average of the machine at start / end: "
        f"{results['load_average_at_start']:.1f} / {results['load_average_at_end']:.1f} on "
        f"{results['cores']} cores: above the core count the figures are indicative only.",
        "",
        "| cell | shoal req/s | shoal p99 ms | MLServer req/s | MLServer p99 ms |",
        "|---|---|---|---|---|",
        *(f"| {key} | {cell('shoal', key)} | {cell('mlserver', key)} |"
          for key in results.get("shoal", {})),
        "",
        "ONNX Runtime in process (the limit, one thread): "
        + ", ".join(f"batch {b} {inprocess[f'batch{b}_rows_per_s']:,.0f} rows/s "
                    f"({inprocess[f'batch{b}_call_us']:.0f} µs a call)" for b in (1, 8, 32))
        + ".",
        END,
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
