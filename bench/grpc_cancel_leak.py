"""The frontend's native heap under gRPC streams that clients cancel, against streams they close
gracefully: grpcio's aio server leaks the op array (~80 bytes) of the read it has outstanding
when a client cancels a bidi stream (grpc/grpc#43360, unfixed in grpcio 1.85.3; fixes are open
as grpc/grpc#43361 and #43409). From the repository root:

    .venv/bin/python -m bench.grpc_cancel_leak [--streams 30000] [--threads 8]

One server over examples/model_repository. Each stream sends one request for a model that does
not exist (answered in-band at once, so the stream count is high), waits for that answer, and
is then closed: first ``--streams`` streams with a cancel (``stop_stream(cancel_requests=True)``,
what a client that gives up does), then as many with the end-of-requests half-close. Prints the
frontend's private heap (RssAnon) before and after each phase. Nothing is written to
RESULTS.md; paste the lines by hand.
"""

from __future__ import annotations

import argparse
import pathlib
import queue
import signal
import tempfile
import threading
import time
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient

from bench import servers


def frontend_anon_mib(server: servers.Server) -> float:
    for process in server.processes():
        if "shoal.frontend" in " ".join(process.cmdline()):
            with open(f"/proc/{process.pid}/status") as status:
                for line in status:
                    if line.startswith("RssAnon:"):
                        return int(line.split()[1]) / 1024
    raise RuntimeError("no frontend process")


def one_stream(url: str, cancel: bool) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put(error))
    tensor = grpcclient.InferInput("START", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], np.int32))
    client.async_stream_infer("no_such_model", [tensor])
    if answers.get(timeout=30) is None:
        raise RuntimeError("a request for a model that does not exist succeeded")
    stream = getattr(client, "_stream", None)
    client.stop_stream(cancel_requests=cancel)
    if cancel and stream is not None:  # tritonclient skips its sentinel on cancel: give it one
        stream._request_queue.put(None)
    client.close()


def phase(server: servers.Server, url: str, streams: int, threads: int, cancel: bool) -> str:
    before = frontend_anon_mib(server)
    started = time.monotonic()
    counter = iter(range(streams))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if next(counter, None) is None:
                    return
            one_stream(url, cancel)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    time.sleep(2)
    after = frontend_anon_mib(server)
    kind = "cancelled" if cancel else "half-closed"
    return (f"{streams:,} {kind} streams in {time.monotonic() - started:.0f} s: frontend RssAnon "
            f"{before:.1f} -> {after:.1f} MiB ({(after - before) * 2**20 / streams:+.0f} B per "
            f"stream)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=30000)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="shoal-cancel-leak-"))
    server = servers.launch_shoal(servers.EXAMPLES, workdir, [], "countdown")
    url = f"127.0.0.1:{server.extra['grpc']}"
    try:
        phase(server, url, 2000, args.threads, cancel=False)  # warm-up: arenas, connections
        print(phase(server, url, args.streams, args.threads, cancel=True), flush=True)
        print(phase(server, url, args.streams, args.threads, cancel=False), flush=True)
        print(f"grpcio {grpc.__version__}")
    finally:
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=60)


if __name__ == "__main__":
    main()
