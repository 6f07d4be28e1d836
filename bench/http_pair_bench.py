"""Paired A/B of the HTTP hot path on small requests: two source trees served at the same time,
each driven by its own ``bench/loadgen.py`` at the same moment, so both see the same machine
load (on a shared machine, alternating runs let the load move between base and new cells).
From the repository root:

    mkdir /tmp/base /tmp/new && git archive <before> | tar -x -C /tmp/base
    git archive <after> | tar -x -C /tmp/new
    .venv/bin/python -m bench.http_pair_bench --base /tmp/base --new /tmp/new --rounds 4
    .venv/bin/python -m bench.http_pair_bench --base /tmp/base --new /tmp/new --realistic

Per round and body kind (JSON and binary, as ``bench/run.py`` writes them, c=64 each) it prints
a JSON line with each tree's req/s and CPU µs per answered request of its frontend, broker and
workers (user + system over the cell, from /proc). The two servers share the cores, so each
runs at about half its solo rate: compare the trees within a line, not with solo runs. Model:
the example MLP (examples/model_repository of the checkout running this), or with
``--realistic`` the realistic MLP of ``bench/realistic.py`` (built into a temporary
repository). Writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import tempfile
import threading
from typing import Any

from bench import loadgen, realistic, servers
from bench.http_large_bench import cpu_seconds, cpu_us_per_request
from bench.run import bodies

ROOT = pathlib.Path(__file__).resolve().parent.parent
KINDS = ("json", "binary")


def start(checkout: pathlib.Path, repository: pathlib.Path,
          root: pathlib.Path) -> tuple[servers.Server, int]:
    """``shoal serve`` from ``checkout`` (its own PYTHONPATH and working directory)."""
    return servers.launch_checkout(checkout, repository, root)

def drive(port: int, model: str, body: tuple[pathlib.Path, list[str]], concurrency: int,
          seconds: float) -> dict[str, Any]:
    return loadgen.in_subprocess(port, f"/v2/models/{model}/infer", body, concurrency, seconds)

def drive_all(ports: dict[str, int], model: str, body: tuple[pathlib.Path, list[str]],
              concurrency: int, seconds: float) -> dict[str, dict[str, Any]]:
    """``drive`` every server at the same time; each one's loadgen result."""
    results: dict[str, dict[str, Any]] = {}

    def one(tree: str, port: int) -> None:
        results[tree] = drive(port, model, body, concurrency, seconds)

    drivers = [threading.Thread(target=one, args=item) for item in ports.items()]
    for driver in drivers:
        driver.start()
    for driver in drivers:
        driver.join()
    if len(results) != len(ports):
        raise RuntimeError("a load generator failed (see its traceback above)")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=pathlib.Path, required=True)
    parser.add_argument("--new", type=pathlib.Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--realistic", action="store_true",
                        help="the realistic MLP (bench/realistic.py) instead of the example one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-http-pair-") as tmp:
        request_bodies = bodies(pathlib.Path(tmp) / "bodies")
        if args.realistic:
            repository, model = pathlib.Path(tmp) / "repository", realistic.NAME
            realistic.shoal_model(repository)
        else:
            repository, model = ROOT / "examples" / "model_repository", "mlp"
        running: dict[str, tuple[servers.Server, int]] = {}
        try:
            for tree, checkout in (("base", args.base), ("new", args.new)):
                (pathlib.Path(tmp) / tree).mkdir()
                running[tree] = start(checkout.resolve(), repository, pathlib.Path(tmp) / tree)
            for _, port in running.values():
                drive(port, model, request_bodies["json"], 16, 3.0)  # warm up
            for round_index in range(args.rounds):
                for kind in KINDS:
                    before = {tree: cpu_seconds(server) for tree, (server, _) in running.items()}
                    results = drive_all({tree: port for tree, (_, port) in running.items()},
                                        model, request_bodies[kind], args.concurrency,
                                        args.seconds)
                    row: dict[str, Any] = {"round": round_index, "kind": kind,
                                           "concurrency": args.concurrency,
                                           "load": round(os.getloadavg()[0], 1)}
                    for tree, (server, _) in running.items():
                        after = cpu_seconds(server)
                        rate = results[tree]["requests_per_s"]
                        row[tree] = {"requests_per_s": round(rate),
                                     **cpu_us_per_request(before[tree], after, rate,
                                                          args.seconds)}
                    print(json.dumps(row), flush=True)
        finally:
            for server, _ in running.values():
                server.stop()


if __name__ == "__main__":
    main()
