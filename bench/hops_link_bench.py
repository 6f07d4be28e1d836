"""The frontend's end of the frontend <-> broker hop, A/B: ``BrokerClient`` over
``shoal.frontend.broker_socket.BrokerSocket`` (the DEALER driven from the event loop) against
the same client over a zmq.asyncio DEALER driven as it was before (a receive task awaiting
``recv_multipart``, one ``ensure_future(send_multipart)`` per message). From the repository root:

    .venv/bin/python -m bench.hops_link_bench [--seconds 5] [--rounds 3] [--no-write]

A second process stands in for the broker: a ROUTER that decodes each InferRequest /
InferRequestBatch and answers each request at once with an InferResponseBatch (one per message
received). The client runs on uvloop, as the frontend does: C coroutines each submit a request
and await its answer, in a loop. Both links alternate ``--rounds`` times against the same peer;
the table gives the best round of each (the machine is shared).

Writes the section between the hops-link markers of bench/RESULTS.md (the rest is kept).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import uvloop
import zmq
import zmq.asyncio

from bench import report, servers
from bench.sections import write_marked_section
from shoal.frontend.broker_client import BrokerClient
from shoal.messages import (
    InferRequest,
    InferRequestBatch,
    InferResponse,
    InferResponseBatch,
    TensorRef,
    decode,
    encode,
)

BEGIN, END = "<!-- hops-link-benchmark:begin -->", "<!-- hops-link-benchmark:end -->"
RESULTS = servers.BENCH / "RESULTS.md"


class AsyncioSocket:
    """The link as BrokerClient drove it before BrokerSocket: zmq.asyncio, a receive task, one
    Future per send. Same interface as BrokerSocket."""

    def __init__(self, endpoint: str, identity: bytes, hwm: int) -> None:
        self._socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        self._socket.setsockopt(zmq.IDENTITY, identity)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, hwm)
        self._socket.setsockopt(zmq.RCVHWM, hwm)
        self._socket.connect(endpoint)
        self._task: asyncio.Task[None] | None = None
        self._sends: set[asyncio.Future[Any]] = set()

    def start(self, on_frames: Callable[[list[bytes]], None]) -> None:
        async def receive() -> None:
            while True:
                on_frames(await self._socket.recv_multipart())

        self._task = asyncio.create_task(receive())

    def send(self, frames: Sequence[bytes]) -> None:
        sent = asyncio.ensure_future(self._socket.send_multipart(frames))
        self._sends.add(sent)
        sent.add_done_callback(self._sends.discard)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._socket.close(linger=0)


def broker_stand_in(address: str) -> None:
    """Answer every request at once, one InferResponseBatch per message received."""
    router: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    router.bind(address)
    ref = TensorRef("OUTPUT0", "FP32", [1, 16], "/shoal-0123456789ab-w1-0", 8192, 64)
    while True:
        identity, *frames = router.recv_multipart()
        if frames[0] == b"stop":
            break
        message = decode(frames)
        if isinstance(message, InferRequest):
            requests = [message]
        elif isinstance(message, InferRequestBatch):
            requests = message.requests
        else:
            continue
        answer = InferResponseBatch([InferResponse(r.request_id, 1, [ref]) for r in requests])
        router.send_multipart([identity, *encode(answer)])
    router.close(linger=0)


async def drive(endpoint: str, link: str, concurrency: int, seconds: float) -> dict[str, float]:
    client = BrokerClient(endpoint, f"fe-bench-{link}", lambda snapshot: None)
    if link == "zmq.asyncio":
        # the A/B swaps only the socket under the same BrokerClient
        client._socket.close()
        client._socket = AsyncioSocket(  # type: ignore[assignment]
            endpoint, b"fe-bench-asyncio", 100_000)
    ref = TensorRef("INPUT0", "FP32", [1, 16], "/shoal-0123456789ab-fe1-0", 4096, 64)
    await client.start()
    next_id = iter(range(1, 1 << 62))
    latencies: list[float] = []

    async def one_client(stop_at: float) -> None:
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            await client.submit(InferRequest(next(next_id), "null", -1, [ref]))
            latencies.append(time.perf_counter() - start)

    try:
        await one_client(time.perf_counter() + 0.3)  # warm-up
        latencies.clear()
        start = time.perf_counter()
        stop_at = start + seconds
        await asyncio.gather(*(one_client(stop_at) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    finally:
        await client.close()
    return {"round_trips_per_s": len(latencies) / elapsed,
            "p50_us": statistics.median(latencies) * 1e6}


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": report.machine(), "load_before": os.getloadavg()[0],
                               "seconds": args.seconds, "rows": []}
    with tempfile.TemporaryDirectory(prefix="shoal-link-") as tmp:
        endpoint = f"ipc://{tmp}/frontend.sock"
        peer = multiprocessing.get_context("spawn").Process(target=broker_stand_in,
                                                            args=(endpoint,))
        peer.start()
        try:
            for concurrency in args.concurrency:
                best: dict[str, dict[str, float]] = {}
                for _ in range(args.rounds):
                    for link in ("zmq.asyncio", "BrokerSocket"):
                        found = uvloop.run(drive(endpoint, link, concurrency, args.seconds))
                        print(link, concurrency, json.dumps(found), flush=True)
                        if (link not in best or found["round_trips_per_s"]
                                > best[link]["round_trips_per_s"]):
                            best[link] = found
                results["rows"].append({"concurrency": concurrency, **{
                    f"{link} {key}": value for link, found in best.items()
                    for key, value in found.items()}})
        finally:
            with contextlib.suppress(zmq.ZMQError):
                stopper: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
                stopper.connect(endpoint)
                stopper.send_multipart([b"stop", b""])
                stopper.close(linger=1000)
            peer.join(timeout=10)
            if peer.is_alive():
                peer.kill()
    results["load_after"] = os.getloadavg()[0]
    return results


def render(results: dict[str, Any], command: str) -> str:
    lines = [BEGIN, "## Hops: the frontend's end of its broker link", "",
             f"Command: `{command}`. Machine: {results['machine']['cores']} cores, "
             f"{results['machine']['cpu']}; 1-minute load average "
             f"{results['load_before']:.1f} before, {results['load_after']:.1f} after "
             "(indicative; best of the alternating rounds).", "",
             "BrokerClient against a stand-in broker that answers at once (round trips "
             "through the frontend's link only; no HTTP, no worker):", "",
             "| in flight | zmq.asyncio (before) round trips/s | p50 µs | BrokerSocket (now) "
             "round trips/s | p50 µs | gain |",
             "|---:|---:|---:|---:|---:|---:|"]
    for row in results["rows"]:
        before = row["zmq.asyncio round_trips_per_s"]
        after = row["BrokerSocket round_trips_per_s"]
        lines.append(f"| {row['concurrency']} | {before:,.0f} | "
                     f"{row['zmq.asyncio p50_us']:.0f} | {after:,.0f} | "
                     f"{row['BrokerSocket p50_us']:.0f} | {after / before:.2f}x |")
    lines.append(END)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")],
                        default=[1, 64])
    parser.add_argument("--no-write", action="store_true", help="print, leave RESULTS.md")
    args = parser.parse_args()
    results = run(args)
    out = servers.BENCH / "out"
    out.mkdir(exist_ok=True)
    (out / "hops_link_results.json").write_text(json.dumps(results, indent=2))
    section = render(results, "python -m bench.hops_link_bench")
    print(section)
    if not args.no_write:
        write_marked_section(RESULTS, BEGIN, END, section)


if __name__ == "__main__":
    main()
