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

import json
import os
import pathlib
import shutil
import subprocess
from typing import Any

import numpy as np

from bench import runtime_bench, servers

BEGIN, END = "<!-- fil-benchmark:begin -->", "<!-- fil-benchmark:end -->"

FIL_EXAMPLE = servers.ROOT / "examples" / "fil_repository" / "xgboost_fil"
MODEL_FILE = FIL_EXAMPLE / "1" / "xgboost.json"
FEATURES = 16
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
    return runtime_bench.time_batches(booster.inplace_predict, FEATURES, seconds)


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
    (workdir / "xgb").mkdir()
    shutil.copy(MODEL_FILE, workdir / "xgb" / "model.json")
    # XGBoost's default thread count is OpenMP's: the same threads as shoal's instance
    return runtime_bench.start_mlserver(workdir, venv, "xgb", {
        "name": "xgb", "implementation": "mlserver_xgboost.XGBoostModel",
        "max_batch_size": MAX_BATCH, "max_batch_time": delay_us / 1e6,
        "parameters": {"uri": "./model.json"}}, {"OMP_NUM_THREADS": str(IN_PROCESS_THREADS)})


def render(results: dict[str, Any]) -> str:
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
        "MLServer's REST has no binary tensors. " + runtime_bench.load_note(results),
        "",
        *runtime_bench.table_rows(results),
        "",
        f"XGBoost inplace_predict in process (the limit; {IN_PROCESS_THREADS} thread(s), the "
        "fil backend's default here, and MLServer's through OMP_NUM_THREADS): "
        + runtime_bench.in_process_line(results["inprocess"]) + ".",
        END,
    ]
    return "\n".join(lines) + "\n"


BENCH = runtime_bench.RuntimeBench(
    name="fil", model="xgb", begin=BEGIN, end=END, bodies=request_bodies,
    in_process=measure_in_process, shoal_repository=shoal_repository,
    prepare_mlserver=ensure_mlserver_xgboost, mlserver=start_mlserver, render=render)


if __name__ == "__main__":
    runtime_bench.main(BENCH, __doc__ or "")
