"""TensorFlow figures (issue #15 part 6): the benchmark MLP as a SavedModel
(examples/tensorflow_repository/mlp_tensorflow) served by shoal's tensorflow backend and by
MLServer with a small custom TensorFlow runtime (bench/tensorflow_mlserver_runtime.py), side by
side at concurrency 1 and 64, and the SavedModel's signature called in process (the limit).
Both servers batch (max batch 32, the same queue delay) and run one intra-op thread.

    .venv/bin/python -m bench.tensorflow_bench [--seconds 5] [--skip-mlserver]

Writes bench/out/tensorflow_results.json and the section between the tensorflow-benchmark
markers of bench/RESULTS.md (``--no-write``: print only). MLServer's virtual environment gets
tensorflow-cpu when it lacks it (a 1.3 GB package). Compare ratios within one run on a quiet
machine; the section records the load average, since numbers from a busy machine are
indicative only.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
from typing import Any

from bench import runtime_bench, servers
from bench.run import bodies

BEGIN, END = "<!-- tensorflow-benchmark:begin -->", "<!-- tensorflow-benchmark:end -->"

TF_EXAMPLE = servers.ROOT / "examples" / "tensorflow_repository" / "mlp_tensorflow"
SAVEDMODEL = TF_EXAMPLE / "1" / "model.savedmodel"


def measure_in_process(seconds: float) -> dict[str, float]:
    """The SavedModel's signature in process, one intra-op thread, at batch sizes 1, 8, 32."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    function = tf.saved_model.load(str(SAVEDMODEL)).signatures["serving_default"]
    return runtime_bench.time_batches(
        lambda x: function(INPUT__0=tf.constant(x))["OUTPUT__0"].numpy(), 256, seconds)


def shoal_repository(workdir: pathlib.Path, delay_us: int) -> pathlib.Path:
    repo = workdir / "repo"
    shutil.copytree(TF_EXAMPLE, repo / "mlp")  # served as "mlp": the shared request bodies
    config = repo / "mlp" / "config.pbtxt"
    config.write_text(config.read_text().replace(
        "max_queue_delay_microseconds: 1000", f"max_queue_delay_microseconds: {delay_us}"))
    return repo


def start_mlserver(workdir: pathlib.Path, venv: pathlib.Path, delay_us: int) -> servers.Server:
    shutil.copy(servers.BENCH / "tensorflow_mlserver_runtime.py",
                workdir / "tensorflow_mlserver_runtime.py")
    return runtime_bench.start_mlserver(workdir, venv, "mlp", {
        "name": "mlp", "implementation": "tensorflow_mlserver_runtime.TensorflowRuntime",
        "max_batch_size": 32, "max_batch_time": delay_us / 1e6,
        "parameters": {"uri": str(SAVEDMODEL)}},
        {"PYTHONPATH": str(workdir)})


def ensure_tensorflow(venv: pathlib.Path) -> None:
    python = str(venv / "bin" / "python")
    if subprocess.run([python, "-c", "import tensorflow"], capture_output=True).returncode:
        subprocess.run([python, "-m", "pip", "install", "-q", "tensorflow-cpu"], check=True)


def render(results: dict[str, Any]) -> str:
    lines = [
        BEGIN,
        "## TensorFlow: shoal's tensorflow backend vs MLServer vs in process",
        "",
        "`.venv/bin/python -m bench.tensorflow_bench` (seconds per cell: "
        f"{results['seconds']}, queue delay {results['delay_us']} µs). The benchmark MLP as a "
        "SavedModel (examples/tensorflow_repository/mlp_tensorflow, 256 -> 64 -> 16) on shoal's "
        "tensorflow backend and on MLServer with a custom TensorFlow runtime "
        "(bench/tensorflow_mlserver_runtime.py); both batch up to 32 with the same delay and run "
        "one intra-op thread. MLServer's REST has no binary tensors. "
        + runtime_bench.load_note(results),
        "",
        *runtime_bench.table_rows(results),
        "",
        "The signature in process (the limit, one thread): "
        + runtime_bench.in_process_line(results["inprocess"]) + ".",
        END,
    ]
    return "\n".join(lines) + "\n"


BENCH = runtime_bench.RuntimeBench(
    name="tensorflow", model="mlp", begin=BEGIN, end=END, bodies=bodies,
    in_process=measure_in_process, shoal_repository=shoal_repository,
    prepare_mlserver=ensure_tensorflow, mlserver=start_mlserver, render=render)


if __name__ == "__main__":
    runtime_bench.main(BENCH, __doc__ or "")
