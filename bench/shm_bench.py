"""Round trip of large FP32 tensors through shoal: system shared memory vs HTTP binary vs gRPC raw
contents, against one in-process memcpy of the same bytes (the limit). From the repository root:

    make bench-shm        # = .venv/bin/python -m bench.shm_bench

Starts its own server (``--allow-client-shm=true``, a large ``--http-max-input-size``) over a
temporary repository holding two python models with dims [-1]: ``copy_fp32`` returns its input
array as its output (an identity), ``cached_fp32`` returns an array it made once per shape (so
the worker's only copy is writing the output). Each column is the median of repeated calls, one
at a time:

- shm round trip: ``np.copyto`` of the array into the registered input region, then infer with the
  input and the output in regions (shoal.client over HTTP); the output is a view of its region.
  "infer only" leaves out the ``np.copyto`` (data produced in the region); "no alias" is the round
  trip with ``cached_fp32``, whose output does not share memory with its input.
- HTTP binary / gRPC: tritonclient, ``set_data_from_numpy`` to ``as_numpy``.
- memcpy: ``np.copyto`` between two pre-faulted arrays of the same size.

Writes the section between the shm-benchmark markers of bench/RESULTS.md (the rest is kept).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from bench import report, servers
from bench.sections import write_marked_section
from shoal.client import ShmClient

SIZES_MB = (1, 16, 64)
REPEATS = {1: 50, 16: 25, 64: 15}
TARGET_RATIO = 3.0
MODEL = "copy_fp32"
CACHED_MODEL = "cached_fp32"
BEGIN, END = "<!-- shm-benchmark:begin -->", "<!-- shm-benchmark:end -->"
RESULTS = servers.BENCH / "RESULTS.md"

COPY_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        # the input array itself is the output: the worker's one copy is writing it out
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""

CACHED_MODEL_SOURCE = """
import triton_python_backend_utils as pb_utils

_MADE = {}


class TritonPythonModel:
    def execute(self, requests):
        # an output made once per shape: it never aliases the input
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            y = _MADE.get(x.shape)
            if y is None:
                y = _MADE[x.shape] = x.copy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y)]))
        return responses
"""


def write_repository(root: pathlib.Path) -> pathlib.Path:
    for name, source in ((MODEL, COPY_MODEL), (CACHED_MODEL, CACHED_MODEL_SOURCE)):
        model = root / "repo" / name
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
            'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]\n'
            'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]\n')
        (model / "1" / "model.py").write_text(source)
    return root / "repo"


@contextlib.contextmanager
def shoal_server(root: pathlib.Path) -> Iterator[tuple[int, int]]:
    """(http port, grpc port) of a server that lives for the ``with`` block."""
    repo = write_repository(root)
    http, grpc, metrics = servers.free_port(), servers.free_port(), servers.free_port()
    command = [sys.executable, "-m", "shoal", "serve", f"--model-repository={repo}",
               f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
               "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
               "--allow-client-shm=true", f"--http-max-input-size={256 * 2**20}",
               f"--shm-arena-byte-size={2 * 2**30}"]
    with open(root / "shoal.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    server = servers.Server("shoal", http, process, root, root / "shoal.log")
    try:
        servers.wait_ready(f"http://127.0.0.1:{http}/v2/health/ready", process)
        yield http, grpc
    finally:
        server.stop()


def timed_spread(call: Callable[[], object], repeat: int, warmup: int = 3) -> tuple[float, float]:
    """(median, minimum) wall time of ``call`` in ms."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3, min(samples) * 1e3


def timed(call: Callable[[], object], repeat: int, warmup: int = 3) -> float:
    """Median wall time of ``call`` in ms."""
    return timed_spread(call, repeat, warmup)[0]


def measure_memcpy(x: np.ndarray, repeat: int) -> float:
    target = np.ones_like(x)  # pages faulted in, as the regions' are
    return timed(lambda: np.copyto(target, x), repeat * 3)


def measure_shm(port: int, x: np.ndarray, repeat: int) -> dict[str, float]:
    """Round trip and infer-only for ``copy_fp32`` (with the server's per-request breakdown),
    round trip for ``cached_fp32``."""
    with ShmClient(f"127.0.0.1:{port}", timeout=300) as client:
        source = client.create_region(x.nbytes, name="bench-in")
        target = client.create_region(x.nbytes, name="bench-out")
        source_view = source.ndarray("FP32", [x.size])
        target.ndarray("FP32", [x.size])[:] = 0  # fault the client's pages in once
        inputs = [source.input("INPUT0", "FP32", [x.size])]
        outputs = [target.output("OUTPUT0")]

        def infer(model: str = MODEL) -> np.ndarray:
            return client.infer(model, inputs, outputs)["OUTPUT0"]

        def round_trip(model: str = MODEL) -> np.ndarray:
            np.copyto(source_view, x)
            return infer(model)

        for model in (MODEL, CACHED_MODEL):
            if not np.array_equal(round_trip(model), x):
                raise RuntimeError(f"shared-memory round trip through {model} returned wrong "
                                   "data")
        before = worker_stats(port)
        result = {"shm_round_trip": timed(round_trip, repeat), "shm_infer": timed(infer, repeat)}
        result.update(per_request(before, worker_stats(port)))
        result["shm_no_alias"] = timed(lambda: round_trip(CACHED_MODEL), repeat)
        return result


def measure_http(port: int, x: np.ndarray, repeat: int) -> float:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=300,
                                              connection_timeout=300)

    def call() -> Any:
        inp = httpclient.InferInput("INPUT0", [x.size], "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
        return client.infer(MODEL, [inp], outputs=[out]).as_numpy("OUTPUT0")

    try:
        if not np.array_equal(call(), x):
            raise RuntimeError("HTTP round trip returned wrong data")
        return timed(call, repeat)
    finally:
        client.close()


def measure_grpc(port: int, x: np.ndarray, repeat: int) -> float | None:
    """None when the server has no gRPC endpoint (or it refuses the size)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")

    def call() -> Any:
        inp = grpcclient.InferInput("INPUT0", [x.size], "FP32")
        inp.set_data_from_numpy(x)
        return client.infer(MODEL, [inp], client_timeout=300).as_numpy("OUTPUT0")

    try:
        if not client.is_server_live() or not np.array_equal(call(), x):
            return None
        return timed(call, repeat)
    except Exception as exc:  # the column is optional: say why it is missing
        print(f"gRPC column left out: {exc}", flush=True)
        return None
    finally:
        client.close()


def worker_stats(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{MODEL}/stats") as reply:
        stats = json.load(reply)["model_stats"][0]
    found = {"count": int(stats["inference_stats"]["success"]["count"])}
    for key in ("queue", "compute_input", "compute_infer", "compute_output"):
        found[key] = int(stats["inference_stats"][key]["ns"])
    return found


def per_request(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Mean ms per request inside the server (broker queue and the worker's three phases)."""
    count = max(1, after["count"] - before["count"])
    return {f"server_{key}": (after[key] - before[key]) / count / 1e6
            for key in ("queue", "compute_input", "compute_infer", "compute_output")}


def run(sizes: tuple[int, ...]) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": report.machine(), "python": platform.python_version(),
                               "load_before": os.getloadavg()[0], "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="shoal-shm-bench-") as tmp, \
            shoal_server(pathlib.Path(tmp)) as (http_port, grpc_port):
        for size_mb in sizes:
            x = np.random.default_rng(size_mb).standard_normal(size_mb * 2**18
                                                               ).astype(np.float32)
            repeat = REPEATS.get(size_mb, 10)
            row: dict[str, Any] = {"memcpy": measure_memcpy(x, repeat)}
            row.update(measure_shm(http_port, x, repeat))
            row["http_binary"] = measure_http(http_port, x, repeat)
            row["grpc"] = measure_grpc(grpc_port, x, repeat)
            results["sizes"][str(size_mb)] = row
            print(size_mb, "MB", json.dumps(row), flush=True)
    results["load_after"] = os.getloadavg()[0]
    return results


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def render(results: dict[str, Any], command: str) -> str:
    rows = results["sizes"]
    lines = [BEGIN, "## Shared memory round trip", "",
             f"Command: `{command}` (one server, one client, calls one at a time; median ms). "
             f"Machine: {results['machine']['cores']} cores, {results['machine']['cpu']}, "
             f"Python {results['python']}; 1-minute load average {results['load_before']:.1f} "
             f"before, {results['load_after']:.1f} after (other work shares the cores).", "",
             "| size | memcpy (limit) | shm round trip | x memcpy | shm infer only "
             "| shm round trip, no alias | HTTP binary | gRPC raw |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for size, row in rows.items():
        ratio = row["shm_round_trip"] / row["memcpy"]
        lines.append(f"| {size} MB | {_ms(row['memcpy'])} | {_ms(row['shm_round_trip'])} | "
                     f"{ratio:.1f}x | {_ms(row['shm_infer'])} | {_ms(row['shm_no_alias'])} | "
                     f"{_ms(row['http_binary'])} | {_ms(row['grpc'])} |")
    if all(row["grpc"] is None for row in rows.values()):
        lines += ["", "gRPC column: no gRPC endpoint answered on this server (left out)."]
    lines += ["", "Inside the server, per shm request (ms; broker queue, then the worker's "
              "input mapping, model call, output write into the client's region):", ""]
    for size, row in rows.items():
        lines.append(f"- {size} MB: queue {row['server_queue']:.2f}, input "
                     f"{row['server_compute_input']:.2f}, infer {row['server_compute_infer']:.2f}"
                     f", output {row['server_compute_output']:.2f}")
    largest = rows[str(max(int(s) for s in rows))]
    ratio = largest["shm_round_trip"] / largest["memcpy"]
    verdict = "met" if ratio <= TARGET_RATIO else "missed"
    lines += ["", f"Target (shm round trip at {max(int(s) for s in rows)} MB within "
              f"{TARGET_RATIO:.0f}x one memcpy): **{verdict}** ({ratio:.1f}x).", END]
    return "\n".join(lines) + "\n"


def write_section(section: str, path: pathlib.Path = RESULTS) -> None:
    """Replace the marked section, or append it after everything else."""
    write_marked_section(path, BEGIN, END, section)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES_MB)),
                        help="tensor sizes in MB, comma separated")
    parser.add_argument("--no-write", action="store_true", help="print, leave RESULTS.md")
    args = parser.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    results = run(sizes)
    out = servers.BENCH / "out"
    out.mkdir(exist_ok=True)
    (out / "shm_results.json").write_text(json.dumps(results, indent=2))
    section = render(results, "make bench-shm")
    print(section)
    if not args.no_write:
        write_section(section)


if __name__ == "__main__":
    main()
