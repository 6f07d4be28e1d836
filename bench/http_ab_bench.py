"""A/B of the HTTP hot path on small requests: this tree against another source tree (e.g. the
commit before a change), alternating, each a fresh server on examples/model_repository driven by
``bench/loadgen.py``. From the repository root:

    mkdir /tmp/base && git archive <commit> | tar -x -C /tmp/base
    .venv/bin/python -m bench.http_ab_bench --base /tmp/base --rounds 3 --seconds 20

Per cell (the example MLP; JSON and binary bodies as ``bench/run.py`` writes them; c=64 and
JSON c=1) it prints a JSON line: req/s, p50/p99, and each server process's CPU µs per answered
request (frontend, broker, worker; user + system over the cell, from /proc). CPU per request is
the steadier figure on a shared machine; req/s and latency move with the machine's load.
Writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import tempfile
from typing import Any

from bench import loadgen, servers
from bench.http_large_bench import cpu_seconds, cpu_us_per_request
from bench.run import bodies

REPOSITORY = pathlib.Path(__file__).resolve().parent.parent / "examples" / "model_repository"
CELLS = (("json", 64), ("binary", 64), ("json", 1))


def start(checkout: pathlib.Path | None, root: pathlib.Path) -> tuple[servers.Server, int]:
    return servers.launch_checkout(checkout, REPOSITORY, root)

def drive(port: int, body: tuple[pathlib.Path, list[str]], concurrency: int,
          seconds: float) -> dict[str, Any]:
    return loadgen.in_subprocess(port, "/v2/models/mlp/infer", body, concurrency, seconds)

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=pathlib.Path, required=True,
                        help="the other source tree (served with PYTHONPATH set to it)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-http-ab-") as tmp:
        request_bodies = bodies(pathlib.Path(tmp) / "bodies")
        for round_index in range(args.rounds):
            for tree, checkout in (("this", None), ("base", args.base)):
                root = pathlib.Path(tmp) / f"{tree}{round_index}"
                root.mkdir()
                running, port = start(checkout, root)
                try:
                    drive(port, request_bodies["json"], 16, 3.0)  # warm up
                    for kind, concurrency in CELLS:
                        before = cpu_seconds(running)
                        result = drive(port, request_bodies[kind], concurrency, args.seconds)
                        after = cpu_seconds(running)
                        row = {"tree": tree, "round": round_index, "kind": kind,
                               "concurrency": concurrency, "load": os.getloadavg()[0],
                               **{key: result[key] for key in
                                  ("requests_per_s", "p50_ms", "p99_ms", "errors")},
                               **cpu_us_per_request(before, after, result["requests_per_s"],
                                                    args.seconds)}
                        print(json.dumps(row), flush=True)
                finally:
                    running.stop()


if __name__ == "__main__":
    main()
