"""What each hop of a request costs (issue #16 part 4). From the repository root:

    .venv/bin/python -m bench.hops_bench [--seconds 10] [--concurrency 1,64] [--no-write]

Two measurements:

1. **Through the server, traced.** ``shoal serve`` over one python model, ``null_fp32`` (FP32
   [16], returns its input, dynamic batching up to 64 rows with no queue delay, so the broker's
   batching wait does not hide the hops), with every request traced (``--trace-config
   rate=1 level=TIMESTAMPS``). A closed loop of C HTTP/1.1 clients (bench/loadgen.py) sends JSON
   requests. From each trace's stamps (one clock, CLOCK_MONOTONIC, in every process):

   - frontend -> broker: REQUEST_START (the frontend hands it to its broker link) to QUEUE_START
     (the broker queued it);
   - broker queue + dispatch: QUEUE_START to COMPUTE_START (its batch leaves for the worker);
   - broker -> worker: COMPUTE_START to COMPUTE_INPUT_END (the worker received the batch and
     mapped its inputs, a few µs);
   - model: COMPUTE_INPUT_END to COMPUTE_OUTPUT_START; outputs written: to COMPUTE_END;
   - worker -> broker -> frontend: COMPUTE_END to REQUEST_END (the frontend's future resolved):
     two hops and the broker's bookkeeping of the result (statistics, lease, answer batching);
   - the edge: the loadgen's latency less REQUEST_START..REQUEST_END (HTTP parse, validation,
     arena copy, response encoding, the socket).

   Medians and p90 over the traces of the timed window. Tracing itself costs (see "Tracing
   overhead"), so req/s here is below an untraced run.

2. **One ZeroMQ hop alone.** Two processes over an ipc DEALER -> ROUTER pair, each message a
   msgspec-encoded ``InferRequestBatch`` of one request (what the frontend sends), answered by an
   ``InferResponseBatch`` of one response, each side decoding what it receives: the round trip
   at 1 message in flight (one hop ~ half of it) and the messages/s with 64 in flight.

Writes the section between the hops-benchmark markers of bench/RESULTS.md (the rest is kept).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import pathlib
import statistics
import tempfile
import time
from collections import defaultdict
from typing import Any

import msgspec
import zmq

from bench import loadgen, report, servers
from bench.sections import write_marked_section
from shoal.messages import (
    InferRequest,
    InferRequestBatch,
    InferResponse,
    InferResponseBatch,
    TensorRef,
)

MODEL = "null_fp32"
BEGIN, END = "<!-- hops-benchmark:begin -->", "<!-- hops-benchmark:end -->"
RESULTS = servers.BENCH / "RESULTS.md"

NULL_CONFIG = """name: "null_fp32"
backend: "python"
max_batch_size: 64
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }]
dynamic_batching { }
instance_group [{ kind: KIND_CPU count: 1 }]
"""
NULL_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
"""
# (segment, from stamp, to stamp)
SEGMENTS = [
    ("frontend -> broker", "REQUEST_START", "QUEUE_START"),
    ("broker queue + dispatch", "QUEUE_START", "COMPUTE_START"),
    ("broker -> worker (+ input mapping)", "COMPUTE_START", "COMPUTE_INPUT_END"),
    ("model execute", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"),
    ("worker writes outputs", "COMPUTE_OUTPUT_START", "COMPUTE_END"),
    ("worker -> broker -> frontend", "COMPUTE_END", "REQUEST_END"),
    ("frontend..frontend (all above)", "REQUEST_START", "REQUEST_END"),
]


def write_null_repository(root: pathlib.Path, instances: int = 1) -> pathlib.Path:
    """A repository holding ``null_fp32`` with ``instances`` CPU instances."""
    model = root / "repo" / MODEL
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(NULL_CONFIG.replace("count: 1", f"count: {instances}"))
    (model / "1" / "model.py").write_text(NULL_MODEL)
    return root / "repo"


def write_body(root: pathlib.Path) -> pathlib.Path:
    body = root / "request.json"
    body.write_text(json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}))
    return body


def load(port: int, body: pathlib.Path, concurrency: int, seconds: float) -> dict[str, float]:
    args = argparse.Namespace(host="127.0.0.1", port=port, path=f"/v2/models/{MODEL}/infer",
                              body_file=str(body), header=[], concurrency=concurrency,
                              seconds=seconds)
    return asyncio.run(loadgen.run(args))


# ------------------------------------------------------------------------ traced server runs


def read_traces(workdir: pathlib.Path) -> list[dict[str, int]]:
    """Each trace's stamps by name, from every trace file the server wrote."""
    stamps: dict[int, dict[str, int]] = defaultdict(dict)
    for path in sorted(workdir.glob("trace.json*")):
        try:
            records = json.loads(path.read_text())
        except ValueError:
            continue  # a file cut short when the server stopped
        for record in records:
            for stamp in record.get("timestamps", ()):
                stamps[record["id"]][stamp["name"]] = int(stamp["ns"])
    return [found for found in stamps.values() if "REQUEST_END" in found]


def segment_table(traces: list[dict[str, int]]) -> dict[str, dict[str, float]]:
    """Segment -> {p50_us, p90_us} over the traces that have both stamps."""
    table: dict[str, dict[str, float]] = {}
    for label, start, end in SEGMENTS:
        values = sorted((t[end] - t[start]) / 1e3 for t in traces
                        if t.get(start) and t.get(end))
        if values:
            table[label] = {"p50_us": statistics.median(values),
                            "p90_us": values[int(0.9 * (len(values) - 1))]}
    return table


def traced_run(root: pathlib.Path, concurrency: int, seconds: float) -> dict[str, Any]:
    workdir = root / f"traced-c{concurrency}"
    workdir.mkdir()
    trace_file = workdir / "trace.json"
    server = servers.launch_shoal(
        write_null_repository(root), workdir,
        [f"--trace-config=triton,file={trace_file}", "--trace-config=triton,log-frequency=2000",
         "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1"], MODEL)
    try:
        result: dict[str, Any] = dict(load(server.port, write_body(root), concurrency, seconds))
    finally:  # stop it, keep the workdir: the trace files are read next
        server.process.terminate()
        server.process.wait(timeout=120)
    traces = read_traces(workdir)
    result["traces"] = len(traces)
    result["segments"] = segment_table(traces)
    print(json.dumps(result), flush=True)
    return result


# ------------------------------------------------------------------------ one ZeroMQ hop


def _request_frames() -> list[bytes]:
    ref = TensorRef("INPUT0", "FP32", [1, 16], "/shoal-0123456789ab-fe1-0", 4096, 64)
    request = InferRequest(7, MODEL, -1, [ref], batch_size=1)
    return [b"\x09", msgspec.msgpack.encode(InferRequestBatch([request]))]


def _echo_peer(address: str, count: int) -> None:
    """ROUTER: decode each request batch, answer it with a response batch."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(address)
    request_decoder = msgspec.msgpack.Decoder(InferRequestBatch)
    ref = TensorRef("OUTPUT0", "FP32", [1, 16], "/shoal-0123456789ab-w1-0", 8192, 64)
    for _ in range(count):
        identity, _kind, body = router.recv_multipart(copy=False)
        batch = request_decoder.decode(body.buffer)
        answer = InferResponseBatch([InferResponse(batch.requests[0].request_id, 1, [ref])])
        router.send_multipart([identity, b"\x0a", msgspec.msgpack.encode(answer)])
    router.close(linger=1000)
    context.term()


def zmq_hop(in_flight: int, messages: int) -> dict[str, float]:
    """Round trips of ``messages`` messages with ``in_flight`` outstanding."""
    with tempfile.TemporaryDirectory(prefix="shoal-hop-") as tmp:
        address = f"ipc://{tmp}/hop.sock"
        peer = multiprocessing.get_context("spawn").Process(
            target=_echo_peer, args=(address, messages + in_flight * 2))
        peer.start()
        context = zmq.Context()
        dealer = context.socket(zmq.DEALER)
        dealer.connect(address)
        frames = _request_frames()
        decoder = msgspec.msgpack.Decoder(InferResponseBatch)
        try:
            for _ in range(in_flight * 2):  # warm-up (and the peer's start)
                dealer.send_multipart(frames)
                decoder.decode(dealer.recv_multipart()[1])
            round_trips: list[float] = []
            start = time.perf_counter()
            sent_at: list[float] = []
            for _ in range(min(in_flight, messages)):
                sent_at.append(time.perf_counter())
                dealer.send_multipart(frames)
            sent = len(sent_at)
            for received in range(messages):
                decoder.decode(dealer.recv_multipart()[1])
                round_trips.append(time.perf_counter() - sent_at[received])
                if sent < messages:
                    sent_at.append(time.perf_counter())
                    dealer.send_multipart(frames)
                    sent += 1
            elapsed = time.perf_counter() - start
        finally:
            dealer.close(linger=0)
            context.term()
            peer.join(timeout=10)
            if peer.is_alive():
                peer.kill()
    return {"in_flight": in_flight, "round_trip_p50_us": statistics.median(round_trips) * 1e6,
            "messages_per_s": messages / elapsed}


# ------------------------------------------------------------------------ report


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": report.machine(), "load_before": os.getloadavg()[0],
                               "seconds": args.seconds, "traced": [], "zmq": []}
    for in_flight in (1, 64):
        results["zmq"].append(zmq_hop(in_flight, args.hop_messages))
        print(json.dumps(results["zmq"][-1]), flush=True)
    with tempfile.TemporaryDirectory(prefix="shoal-hops-bench-") as tmp:
        for concurrency in args.concurrency:
            results["traced"].append(traced_run(pathlib.Path(tmp), concurrency, args.seconds))
    results["load_after"] = os.getloadavg()[0]
    return results


def render(results: dict[str, Any], command: str) -> str:
    traced = results["traced"]
    lines = [BEGIN, "## Hops: what each ZeroMQ hop costs", "",
             f"Command: `{command}`. Machine: {results['machine']['cores']} cores, "
             f"{results['machine']['cpu']}; 1-minute load average "
             f"{results['load_before']:.1f} before, {results['load_after']:.1f} after "
             "(indicative only on a shared machine; the load generator shares the cores).", "",
             f"Through the server, every request traced, `{MODEL}` (python, returns its input, "
             f"dynamic batching with no delay), JSON over HTTP, {results['seconds']:g} s per "
             "concurrency. µs, p50 (p90):", "",
             "| segment | " + " | ".join(f"c={row['concurrency']}" for row in traced) + " |",
             "|---|" + "---:|" * len(traced)]
    for label, _, _ in SEGMENTS:
        cells = []
        for row in traced:
            cell = row["segments"].get(label)
            cells.append("—" if cell is None else
                         f"{cell['p50_us']:.0f} ({cell['p90_us']:.0f})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| client latency (loadgen) p50 | "
                 + " | ".join(f"{row['p50_ms'] * 1e3:.0f}" for row in traced) + " |")
    lines.append("| requests/s (traced) | "
                 + " | ".join(f"{row['requests_per_s']:.0f}" for row in traced) + " |")
    lines += ["", "One ZeroMQ hop alone (ipc DEALER -> ROUTER between two processes, msgspec "
              "InferRequestBatch out, InferResponseBatch back, both decoded):", ""]
    for row in results["zmq"]:
        if row["in_flight"] == 1:
            lines.append(f"- 1 in flight: round trip p50 {row['round_trip_p50_us']:.0f} µs "
                         f"(one hop ~ {row['round_trip_p50_us'] / 2:.0f} µs)")
        else:
            lines.append(f"- {row['in_flight']} in flight: {row['messages_per_s']:,.0f} round "
                         f"trips/s, i.e. {1e6 / row['messages_per_s']:.0f} µs of the two "
                         "processes' time per round trip (two hops, encode + decode each)")
    lines.append(END)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")],
                        default=[1, 64])
    parser.add_argument("--hop-messages", type=int, default=20_000)
    parser.add_argument("--no-write", action="store_true", help="print, leave RESULTS.md")
    args = parser.parse_args()
    results = run(args)
    out = servers.BENCH / "out"
    out.mkdir(exist_ok=True)
    (out / "hops_results.json").write_text(json.dumps(results, indent=2))
    section = render(results, "python -m bench.hops_bench")
    print(section)
    if not args.no_write:
        write_marked_section(RESULTS, BEGIN, END, section)


if __name__ == "__main__":
    main()
