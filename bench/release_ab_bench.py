"""A/B of lease releases riding on messages sent anyway (issue #16 part 4): two source trees
(the commit before the change and the change, each a ``git archive`` copy), alternating, each a
fresh server on the realistic model (``bench/realistic.py``) driven with JSON bodies by
``bench/loadgen.py``. From the repository root:

    mkdir /tmp/base /tmp/new && git archive <before> | tar -x -C /tmp/base
    git archive <after> | tar -x -C /tmp/new
    .venv/bin/python -m bench.release_ab_bench --base /tmp/base --new /tmp/new --rounds 4

Per cell (JSON c=64 and c=1) it prints a JSON line: req/s, p50/p99, and each server process's
CPU µs per answered request (frontend, broker, worker; user + system over the cell, from
/proc), and the messages sent per answered request, by kind: broker -> workers and frontend ->
broker (counted by a ``sitecustomize`` that this script puts on the servers' PYTHONPATH: it
wraps ``WorkerLink.send`` in the broker and ``BrokerClient._send`` in the frontend, and touches
neither tree; the wrappers cost some CPU of their own, the same in both trees). CPU per request
is the steadier figure on a shared machine; alternate rounds and compare medians. Writes
nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import tempfile
import time
from typing import Any

from bench import loadgen, realistic, servers
from bench.http_large_bench import cpu_seconds, cpu_us_per_request
from bench.run import bodies

CELLS = (("json", 64), ("json", 1))

# Counts messages by kind into $SHOAL_SEND_COUNTS.<role> (JSON, rewritten every 0.1 s):
# in the broker its sends to workers (WorkerLink.send), in a frontend its sends to the broker
# (BrokerClient._send); processes are recognised by their command line.
COUNTER = """
import json, os, threading, time
_cmdline = open("/proc/self/cmdline", "rb").read()
def _counting(original, path):
    counts = {}
    def dump():
        while True:
            time.sleep(0.1)
            with open(path + ".tmp", "w") as out:
                json.dump(dict(counts), out)
            os.replace(path + ".tmp", path)
    threading.Thread(target=dump, daemon=True).start()
    def send(self, *args):
        message = args[-1]
        kind = type(message).__name__
        counts[kind] = counts.get(kind, 0) + 1
        if getattr(message, "releases", None):
            counts[kind + "+releases"] = counts.get(kind + "+releases", 0) + 1
        return original(self, *args)
    return send
if b"shoal.broker" in _cmdline:
    from shoal.broker import worker_link
    worker_link.WorkerLink.send = _counting(worker_link.WorkerLink.send,
                                            os.environ["SHOAL_SEND_COUNTS"] + ".broker")
elif b"shoal.frontend" in _cmdline:
    from shoal.frontend import broker_client
    broker_client.BrokerClient._send = _counting(broker_client.BrokerClient._send,
                                                 os.environ["SHOAL_SEND_COUNTS"] + ".frontend")
"""
KINDS = {"broker": ("Batch", "Batch+releases", "ReleaseLeases"),
         "frontend": ("InferRequest", "InferRequestBatch", "InferRequestBatch+releases",
                      "ReleaseLeases")}


def sent_counts(root: pathlib.Path) -> dict[str, int]:
    """Messages sent so far, "<role>:<kind>" -> count (one frontend: --http-workers 1)."""
    counts: dict[str, int] = {}
    for role in KINDS:
        try:
            mine: dict[str, int] = json.loads((root / f"sent.json.{role}").read_text())
        except FileNotFoundError:
            continue
        counts.update({f"{role}:{kind}": n for kind, n in mine.items()})
    return counts


def start(checkout: pathlib.Path, repo: pathlib.Path, root: pathlib.Path, hook: pathlib.Path
          ) -> tuple[servers.Server, int]:
    """``shoal serve`` from ``checkout`` with the message-counting hook on its path."""
    return servers.launch_checkout(checkout, repo, root, {
        "PYTHONPATH": str(hook), "SHOAL_SEND_COUNTS": str(root / "sent.json")})

def drive(port: int, body: tuple[pathlib.Path, list[str]], concurrency: int,
          seconds: float) -> dict[str, Any]:
    return loadgen.in_subprocess(port, f"/v2/models/{realistic.NAME}/infer", body,
                                 concurrency, seconds)

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=pathlib.Path, required=True)
    parser.add_argument("--new", type=pathlib.Path, required=True)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="shoal-release-ab-") as tmp:
        repo = pathlib.Path(tmp) / "repo"
        realistic.shoal_model(repo)
        request_bodies = bodies(pathlib.Path(tmp) / "bodies")
        hook = pathlib.Path(tmp) / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(COUNTER)
        for round_index in range(args.rounds):
            trees = (("new", args.new), ("base", args.base))
            for tree, checkout in trees if round_index % 2 == 0 else trees[::-1]:
                root = pathlib.Path(tmp) / f"{tree}{round_index}"
                root.mkdir()
                running, port = start(checkout.resolve(), repo, root, hook)
                try:
                    drive(port, request_bodies["json"], 16, 3.0)  # warm up
                    for kind, concurrency in CELLS:
                        time.sleep(0.3)  # the counts so far are written
                        before, sent_before = cpu_seconds(running), sent_counts(root)
                        result = drive(port, request_bodies[kind], concurrency, args.seconds)
                        after = cpu_seconds(running)
                        time.sleep(0.3)  # the counts of the cell's last sends are written
                        sent_after = sent_counts(root)
                        answered = max(1.0, result["requests_per_s"] * args.seconds)
                        row = {"tree": tree, "round": round_index, "kind": kind,
                               "concurrency": concurrency, "load": os.getloadavg()[0],
                               **{key: result[key] for key in
                                  ("requests_per_s", "p50_ms", "p99_ms", "errors")},
                               **cpu_us_per_request(before, after, result["requests_per_s"],
                                                    args.seconds)}
                        for role, kinds in KINDS.items():
                            for name in kinds:
                                key = f"{role}:{name}"
                                row[f"sent_{key}"] = round(
                                    (sent_after.get(key, 0) - sent_before.get(key, 0)) / answered,
                                    4)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                finally:
                    running.stop()
    for kind, concurrency in CELLS:
        for tree in ("base", "new"):
            mine = [r for r in rows if r["tree"] == tree and r["kind"] == kind
                    and r["concurrency"] == concurrency]
            summary = {key: round(statistics.median(r[key] for r in mine), 4) for key in
                       ("requests_per_s", "p50_ms", "p99_ms", "cpu_us_frontend",
                        "cpu_us_broker", "cpu_us_worker",
                        *(f"sent_{role}:{name}" for role, kinds in KINDS.items()
                          for name in kinds))}
            print(json.dumps({"median": tree, "kind": kind, "concurrency": concurrency,
                              **summary}), flush=True)


if __name__ == "__main__":
    main()
