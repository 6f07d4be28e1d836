"""Where the time of a large gRPC round trip goes: the client's part (tritonclient's protobuf
encoding), the server frontend's part (before and after ``shoal/frontend/grpc/wire.py``), the
worker's part, and the rest (grpc core on both ends, HTTP/2 over loopback, the ZeroMQ hops).
From the repository root:

    .venv/bin/python -m bench.grpc_large_bench [--sizes 16,64] [--no-write]

- round trip: tritonclient.grpc ``infer`` of an FP32 [N] tensor through ``copy_fp32`` (the
  python identity model of bench/shm_bench.py; its server), ``set_data_from_numpy`` to
  ``as_numpy``, calls one at a time, median.
- client part (in process, no server): what tritonclient does for one call besides the network:
  ``InferInput.set_data_from_numpy``, building and serializing the ModelInferRequest, parsing the
  ModelInferResponse and ``as_numpy``.
- frontend part (in process): parsing the request, the one copy into the arena, encoding the
  answer; "now" with ``wire.parse_infer_request`` / ``encode_infer_response``, "protobuf" the
  way it was (``FromString``, ``raw_input_contents[i]``, ``bytes(view)`` appended,
  ``SerializeToString``).
- worker part: the model's statistics per request (queue + compute input/infer/output).

Writes the section between the grpc-large markers of bench/RESULTS.md (the rest is kept).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import tempfile
import urllib.request
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc._utils import _get_inference_request

from bench import report, servers
from bench.sections import write_marked_section
from bench.shm_bench import MODEL, shoal_server, timed
from shoal.frontend.core.validation import InferPlan
from shoal.frontend.grpc.encode import encode_infer_response
from shoal.frontend.grpc.wire import parse_infer_request
from shoal.messages import InferResponse, TensorRef

BEGIN, END = "<!-- grpc-large-benchmark:begin -->", "<!-- grpc-large-benchmark:end -->"
RESULTS = servers.BENCH / "RESULTS.md"
REPEATS = {1: 30, 16: 12, 64: 8}


def client_request(x: np.ndarray) -> bytes:
    tensor = grpcclient.InferInput("INPUT0", [x.size], "FP32")
    tensor.set_data_from_numpy(x)
    request = _get_inference_request(MODEL, [tensor], "", "", None, 0, False, False, 0, None,
                                     None)
    return request.SerializeToString()  # type: ignore[no-any-return]


def client_answer(data: bytes) -> np.ndarray:
    result = grpcclient.InferResult(pb.ModelInferResponse.FromString(data))
    return np.asarray(result.as_numpy("OUTPUT0"))


def frontend_now(data: bytes, arena: np.ndarray) -> bytes:
    """Parse, copy into the arena, answer from the arena (standing in for the worker's slot)."""
    wire = parse_infer_request(data)
    np.copyto(arena, np.frombuffer(wire.raw[0], np.float32))
    ref = TensorRef("OUTPUT0", "FP32", [arena.size], "/bench", 0, arena.nbytes)
    view = arena.data.cast("B")
    return encode_infer_response(InferResponse(1, 1, [ref]), model_name=MODEL, model_version=1,
                                 client_id="", plan=InferPlan(1, [], False, True),
                                 batching=False, output_view=lambda _: view)


def frontend_protobuf(data: bytes, arena: np.ndarray) -> bytes:
    """The same through protobuf, as the frontend did before wire.py."""
    message = pb.ModelInferRequest.FromString(data)
    raw = memoryview(message.raw_input_contents[0])
    np.copyto(arena, np.frombuffer(raw, np.float32))
    reply = pb.ModelInferResponse(model_name=MODEL, model_version="1")
    reply.outputs.add(name="OUTPUT0", datatype="FP32", shape=[arena.size])
    reply.raw_output_contents.append(bytes(arena.data.cast("B")))
    return reply.SerializeToString()  # type: ignore[no-any-return]


def worker_ns(port: int) -> dict[str, int]:
    """The model's success count and its summed queue + compute ns so far."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{MODEL}/stats") as reply:
        stats = json.load(reply)["model_stats"][0]["inference_stats"]
    return {"count": int(stats["success"]["count"]),
            "ns": sum(int(stats[key]["ns"]) for key in
                      ("queue", "compute_input", "compute_infer", "compute_output"))}


def measure(http_port: int, grpc_port: int, size_mb: int) -> dict[str, float]:
    x = np.random.default_rng(size_mb).standard_normal(size_mb * 2**18).astype(np.float32)
    repeat = REPEATS.get(size_mb, 8)
    arena = np.ones_like(x)
    row: dict[str, float] = {"memcpy": timed(lambda: np.copyto(arena, x), repeat * 3)}
    request = client_request(x)
    answer = frontend_now(request, arena)
    if not np.array_equal(client_answer(answer), x) or frontend_protobuf(request, arena) != answer:
        raise RuntimeError("in-process encodings disagree")
    row["client_request"] = timed(lambda: client_request(x), repeat)
    row["client_answer"] = timed(lambda: client_answer(answer), repeat)
    row["frontend_now"] = timed(lambda: frontend_now(request, arena), repeat)
    row["frontend_protobuf"] = timed(lambda: frontend_protobuf(request, arena), repeat)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        def call() -> np.ndarray:
            tensor = grpcclient.InferInput("INPUT0", [x.size], "FP32")
            tensor.set_data_from_numpy(x)
            answer = client.infer(MODEL, [tensor], client_timeout=300)
            return np.asarray(answer.as_numpy("OUTPUT0"))

        if not np.array_equal(call(), x):
            raise RuntimeError("gRPC round trip returned wrong data")
        before = worker_ns(http_port)
        row["round_trip"] = timed(call, repeat)
        after = worker_ns(http_port)
    finally:
        client.close()
    row["worker"] = (after["ns"] - before["ns"]) / max(1, after["count"] - before["count"]) / 1e6
    return row


def run(sizes: tuple[int, ...]) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": report.machine(), "python": platform.python_version(),
                               "load_before": os.getloadavg()[0], "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="shoal-grpc-large-") as tmp, \
            shoal_server(pathlib.Path(tmp)) as (http_port, grpc_port):
        for size_mb in sizes:
            results["sizes"][str(size_mb)] = row = measure(http_port, grpc_port, size_mb)
            print(size_mb, "MB", json.dumps(row), flush=True)
    results["load_after"] = os.getloadavg()[0]
    return results


def render(results: dict[str, Any], command: str) -> str:
    def ms(value: float) -> str:
        return f"{value:.1f}"

    lines = [BEGIN, "## Large tensors over gRPC: where the round trip goes", "",
             f"Command: `{command}` (one server, one client, calls one at a time; median ms). "
             f"Machine: {results['machine']['cores']} cores, {results['machine']['cpu']}; "
             f"1-minute load average {results['load_before']:.1f} before, "
             f"{results['load_after']:.1f} after: indicative only on a shared machine.", "",
             "| size | memcpy | round trip | client: request | client: answer | frontend now "
             "| frontend via protobuf (before) | worker | rest (grpc core, loopback, hops) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for size, row in results["sizes"].items():
        client = row["client_request"] + row["client_answer"]
        rest = row["round_trip"] - client - row["frontend_now"] - row["worker"]
        lines.append(f"| {size} MB | {ms(row['memcpy'])} | {ms(row['round_trip'])} | "
                     f"{ms(row['client_request'])} | {ms(row['client_answer'])} | "
                     f"{ms(row['frontend_now'])} ({row['frontend_now'] / row['memcpy']:.1f}x "
                     f"memcpy) | {ms(row['frontend_protobuf'])} | {ms(row['worker'])} | "
                     f"{ms(rest) if rest > 0 else '— (noise: the in-process parts ran slower)'} |")
    lines += ["", "Client and frontend columns are timed in process (no server): the client's "
              "is tritonclient's own protobuf work, not shoal's. The frontend's \"now\" is "
              "parse (raw inputs stay views of the received bytes), one copy into the arena, "
              "one copy of the output into the answer's bytes; \"before\" is the same through "
              "protobuf messages. \"rest\" is the round trip less the other columns.", END]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="16,64", help="tensor sizes in MB, comma separated")
    parser.add_argument("--no-write", action="store_true", help="print, leave RESULTS.md")
    args = parser.parse_args()
    results = run(tuple(int(s) for s in args.sizes.split(",")))
    out = servers.BENCH / "out"
    out.mkdir(exist_ok=True)
    (out / "grpc_large_results.json").write_text(json.dumps(results, indent=2))
    section = render(results, "python -m bench.grpc_large_bench")
    print(section)
    if not args.no_write:
        write_marked_section(RESULTS, BEGIN, END, section)


if __name__ == "__main__":
    main()
