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

import pathlib
import shutil
import subprocess
from typing import Any

from bench import runtime_bench, servers
from bench.run import bodies

BEGIN, END = "<!-- onnx-benchmark:begin -->", "<!-- onnx-benchmark:end -->"

ONNX_EXAMPLE = servers.ROOT / "examples" / "onnx_repository" / "mlp_onnx"


def measure_in_process(seconds: float) -> dict[str, float]:
    """ONNX Runtime in process, one intra-op thread, at batch sizes 1, 8 and 32."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(ONNX_EXAMPLE / "1" / "model.onnx"), sess_options=options,
                                   providers=["CPUExecutionProvider"])
    return runtime_bench.time_batches(lambda x: session.run(None, {"INPUT__0": x}), 256, seconds)


def shoal_repository(workdir: pathlib.Path, delay_us: int) -> pathlib.Path:
    repo = workdir / "repo"
    shutil.copytree(ONNX_EXAMPLE, repo / "mlp")  # served as "mlp": the shared request bodies
    config = repo / "mlp" / "config.pbtxt"
    config.write_text(config.read_text().replace(
        "max_queue_delay_microseconds: 1000", f"max_queue_delay_microseconds: {delay_us}"))
    return repo


def start_mlserver(workdir: pathlib.Path, venv: pathlib.Path, delay_us: int) -> servers.Server:
    shutil.copy(servers.BENCH / "mlserver" / "onnx_runtime.py", workdir / "onnx_runtime.py")
    return runtime_bench.start_mlserver(workdir, venv, "mlp", {
        "name": "mlp", "implementation": "onnx_runtime.OnnxRuntime",
        "max_batch_size": 32, "max_batch_time": delay_us / 1e6,
        "parameters": {"uri": str(ONNX_EXAMPLE / "1" / "model.onnx")}},
        {"PYTHONPATH": str(workdir)})


def ensure_onnxruntime(venv: pathlib.Path) -> None:
    python = str(venv / "bin" / "python")
    if subprocess.run([python, "-c", "import onnxruntime"], capture_output=True).returncode:
        subprocess.run([python, "-m", "pip", "install", "-q", "onnxruntime"], check=True)


def render(results: dict[str, Any]) -> str:
    lines = [
        BEGIN,
        "## ONNX Runtime: shoal's onnxruntime backend vs MLServer vs in process",
        "",
        "`.venv/bin/python -m bench.onnx_bench` (seconds per cell: "
        f"{results['seconds']}, queue delay {results['delay_us']} µs). The benchmark MLP as ONNX "
        "(examples/onnx_repository/mlp_onnx, 256 -> 64 -> 16) on shoal's onnxruntime backend and "
        "on MLServer with a custom ONNX Runtime runtime (bench/mlserver/onnx_runtime.py); both "
        "batch up to 32 with the same delay and run one intra-op thread. MLServer's REST has no "
        "binary tensors. " + runtime_bench.load_note(results),
        "",
        *runtime_bench.table_rows(results),
        "",
        "ONNX Runtime in process (the limit, one thread): "
        + runtime_bench.in_process_line(results["inprocess"]) + ".",
        END,
    ]
    return "\n".join(lines) + "\n"


BENCH = runtime_bench.RuntimeBench(
    name="onnx", model="mlp", begin=BEGIN, end=END, bodies=bodies,
    in_process=measure_in_process, shoal_repository=shoal_repository,
    prepare_mlserver=ensure_onnxruntime, mlserver=start_mlserver, render=render)


if __name__ == "__main__":
    runtime_bench.main(BENCH, __doc__ or "")
