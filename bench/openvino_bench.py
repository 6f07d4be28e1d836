"""OpenVINO figures (issue #15 part 2): the benchmark MLP as OpenVINO IR
(examples/openvino_repository/mlp_openvino) served by shoal's openvino backend and by MLServer
with a small OpenVINO runtime (bench/mlserver/openvino_runtime.py), side by side at concurrency
1 and 64, and OpenVINO called in process (the limit). Both servers batch (max batch 32, the same
queue delay) and compile with one inference thread, one stream and the LATENCY hint.

    .venv/bin/python -m bench.openvino_bench [--seconds 5] [--skip-mlserver]

Writes bench/out/openvino_results.json and the section between the openvino-benchmark markers
of bench/RESULTS.md (``--no-write``: print only). Compare ratios within one run on a quiet
machine; the section records the load average, since numbers from a busy machine are indicative
only. The MLServer side installs ``openvino`` into its venv the first time.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
from typing import Any

from bench import runtime_bench, servers
from bench.run import bodies

BEGIN, END = "<!-- openvino-benchmark:begin -->", "<!-- openvino-benchmark:end -->"

OPENVINO_EXAMPLE = servers.ROOT / "examples" / "openvino_repository" / "mlp_openvino"
PROPERTIES = {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}


def measure_in_process(seconds: float) -> dict[str, float]:
    """OpenVINO in process (one infer request, the example's properties) at batch sizes 1, 8
    and 32."""
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(OPENVINO_EXAMPLE / "1" / "model.xml"))
    request = core.compile_model(model, "CPU", PROPERTIES).create_infer_request()
    return runtime_bench.time_batches(lambda x: request.infer([x]), 256, seconds)


def shoal_repository(workdir: pathlib.Path, delay_us: int) -> pathlib.Path:
    repo = workdir / "repo"
    shutil.copytree(OPENVINO_EXAMPLE, repo / "mlp")  # served as "mlp": the shared request bodies
    config = repo / "mlp" / "config.pbtxt"
    config.write_text(config.read_text().replace(
        "max_queue_delay_microseconds: 1000", f"max_queue_delay_microseconds: {delay_us}"))
    return repo


def start_mlserver(workdir: pathlib.Path, venv: pathlib.Path, delay_us: int) -> servers.Server:
    shutil.copy(servers.BENCH / "mlserver" / "openvino_runtime.py",
                workdir / "openvino_runtime.py")
    return runtime_bench.start_mlserver(workdir, venv, "mlp", {
        "name": "mlp", "implementation": "openvino_runtime.OpenvinoRuntime",
        "max_batch_size": 32, "max_batch_time": delay_us / 1e6,
        "parameters": {"uri": str(OPENVINO_EXAMPLE / "1" / "model.xml")}},
        {"PYTHONPATH": str(workdir)})


def ensure_openvino(venv: pathlib.Path) -> None:
    python = str(venv / "bin" / "python")
    if subprocess.run([python, "-c", "import openvino"], capture_output=True).returncode:
        subprocess.run([python, "-m", "pip", "install", "-q", "openvino"], check=True)


def render(results: dict[str, Any]) -> str:
    lines = [
        BEGIN,
        "## OpenVINO: shoal's openvino backend vs MLServer vs in process",
        "",
        "`.venv/bin/python -m bench.openvino_bench` (seconds per cell: "
        f"{results['seconds']}, queue delay {results['delay_us']} µs). The benchmark MLP as "
        "OpenVINO IR (examples/openvino_repository/mlp_openvino, 256 -> 64 -> 16) on shoal's "
        "openvino backend and on MLServer with a custom OpenVINO runtime "
        "(bench/mlserver/openvino_runtime.py); both batch up to 32 with the same delay and "
        "compile with one inference thread, one stream, LATENCY. MLServer's REST has no binary "
        "tensors. " + runtime_bench.load_note(results),
        "",
        *runtime_bench.table_rows(results),
        "",
        "OpenVINO in process (the limit, one thread): "
        + runtime_bench.in_process_line(results["inprocess"]) + ".",
        END,
    ]
    return "\n".join(lines) + "\n"


BENCH = runtime_bench.RuntimeBench(
    name="openvino", model="mlp", begin=BEGIN, end=END, bodies=bodies,
    in_process=measure_in_process, shoal_repository=shoal_repository,
    prepare_mlserver=ensure_openvino, mlserver=start_mlserver, render=render)


if __name__ == "__main__":
    runtime_bench.main(BENCH, __doc__ or "")
