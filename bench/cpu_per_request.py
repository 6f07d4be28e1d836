"""CPU per answered request of each shoal process (frontend, broker, workers) on the realistic
MLP of bench/realistic.py under a closed loop at concurrency C, driven by wrk (HTTP JSON or
binary) or h2load (gRPC) through bench/native_loadgen.py, which cost little CPU themselves.
For before/after comparisons of hot-path changes (``--checkout`` serves another source tree,
e.g. ``git archive <commit> | tar -x -C DIR``); prints one JSON line per round, writes nothing.

    .venv/bin/python -m bench.cpu_per_request --kind binary --rounds 3 [--checkout DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import tempfile

from bench import grpc_loadgen, native_loadgen, realistic, servers
from bench.http_large_bench import cpu_seconds, cpu_us_per_request
from bench.run import bodies, sample_row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("json", "binary", "grpc"), default="binary")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--checkout", type=pathlib.Path, default=None)
    args = parser.parse_args()
    if not native_loadgen.available():
        raise SystemExit("needs wrk and h2load (apt-get install wrk nghttp2-client)")
    with tempfile.TemporaryDirectory(prefix="shoal-cpu-per-request-") as tmp:
        root = pathlib.Path(tmp)
        request_bodies = bodies(root / "bodies")
        repository = root / "repository"
        realistic.shoal_model(repository)
        server, port = servers.launch_checkout(
            args.checkout.resolve() if args.checkout else None, repository, root)
        grpc_port = int(next(a for a in server.process.args
                             if str(a).startswith("--grpc-port=")).split("=")[1])
        path = f"/v2/models/{realistic.NAME}/infer"
        request = grpc_loadgen.infer_request(realistic.NAME, "INPUT__0", sample_row())
        try:
            native_loadgen.http(port, path, request_bodies["json"], 16, 2)  # warm up
            for round_index in range(args.rounds):
                before = cpu_seconds(server)
                if args.kind == "grpc":
                    result = native_loadgen.grpc_load(grpc_port, request, args.concurrency,
                                                      args.seconds)
                else:
                    result = native_loadgen.http(port, path, request_bodies[args.kind],
                                                 args.concurrency, args.seconds)
                after = cpu_seconds(server)
                print(json.dumps({
                    "kind": args.kind, "round": round_index,
                    "requests_per_s": round(result["requests_per_s"]),
                    "p99_ms": round(result["p99_ms"], 1), "errors": result["errors"],
                    **cpu_us_per_request(before, after, result["requests_per_s"], args.seconds),
                    "load": round(os.getloadavg()[0], 1)}), flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
