"""How shoal scales (issue #16 part 5): the broker's ceiling and the gain of ``--http-workers``
and of more instances. From the repository root:

    .venv/bin/python -m bench.scaling_bench [--seconds 10] [--concurrency 64] [--no-write]

For each setting (``--http-workers`` x instances of the model), one ``shoal serve`` over
``null_fp32`` (bench/hops_bench.py: python, FP32 [16], returns its input, dynamic batching up to
64 rows with no delay, so the model costs next to nothing), driven by a closed loop of C HTTP/1.1
clients sending JSON (bench/loadgen.py) for ``--seconds``. Besides req/s and latency, the CPU
time each process of the server used in the timed window (psutil, user + system) is divided by
the requests served: the CPU µs one request costs in the broker, in the frontends and in the
workers. The broker is one thread, so ``1e6 / broker µs`` is its ceiling in requests/s at that
batch size; the frontends and workers are separate processes that scale out with
``--http-workers`` and instances. The model is a null model on purpose: a real model adds its
compute to the workers' share only.

Writes the section between the scaling-benchmark markers of bench/RESULTS.md (the rest is kept).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import tempfile
import urllib.request
from typing import Any

import psutil

from bench import loadgen, report, servers
from bench.hops_bench import MODEL, write_body, write_null_repository
from bench.sections import write_marked_section

BEGIN, END = "<!-- scaling-benchmark:begin -->", "<!-- scaling-benchmark:end -->"
RESULTS = servers.BENCH / "RESULTS.md"
# (--http-workers, instances)
SETTINGS = [(1, 1), (2, 1), (1, 2), (2, 2)]
ROLES = {"shoal.broker": "broker", "shoal.frontend": "frontend", "shoal.workers": "worker"}


def role(process: psutil.Process) -> str | None:
    """broker / frontend / worker from the child's command line (``python -m shoal.X``)."""
    try:
        command = process.cmdline()
    except psutil.Error:
        return None
    for module, name in ROLES.items():
        if module in command:
            return name
    return None


def cpu_seconds(server: servers.Server) -> dict[str, float]:
    """CPU seconds (user + system) used so far by the server's processes, summed per role."""
    totals = {"broker": 0.0, "frontend": 0.0, "worker": 0.0}
    for process in server.processes():
        name = role(process)
        if name is None:
            continue
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        totals[name] += times.user + times.system
    return totals


def model_counts(port: int) -> tuple[int, int]:
    """(inference count, execution count) of the model so far."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{MODEL}/stats") as reply:
        stats = json.load(reply)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def run_setting(root: pathlib.Path, http_workers: int, instances: int, concurrency: int,
                seconds: float) -> dict[str, Any]:
    workdir = root / f"w{http_workers}-i{instances}"
    workdir.mkdir()
    repo = write_null_repository(workdir, instances)
    server = servers.launch_shoal(repo, workdir, [f"--http-workers={http_workers}"], MODEL)
    try:
        body = write_body(workdir)
        args = argparse.Namespace(host="127.0.0.1", port=server.port,
                                  path=f"/v2/models/{MODEL}/infer", body_file=str(body),
                                  header=[], concurrency=concurrency, seconds=seconds)
        asyncio.run(loadgen.run(argparse.Namespace(**{**vars(args), "seconds": 1.0})))  # warm
        counts_before, cpu_before = model_counts(server.port), cpu_seconds(server)
        client_before = psutil.Process().cpu_times()
        result: dict[str, Any] = dict(asyncio.run(loadgen.run(args)))
        client_after = psutil.Process().cpu_times()
        counts_after, cpu_after = model_counts(server.port), cpu_seconds(server)
    finally:
        server.stop()
    served = max(1, counts_after[0] - counts_before[0])
    executions = max(1, counts_after[1] - counts_before[1])
    result.update(http_workers=http_workers, instances=instances, served=served,
                  mean_batch=served / executions)
    for name in ("broker", "frontend", "worker"):
        result[f"{name}_cpu_us"] = (cpu_after[name] - cpu_before[name]) / served * 1e6
    client_cpu = (client_after.user + client_after.system
                  - client_before.user - client_before.system)
    result["client_cpu_us"] = client_cpu / served * 1e6
    print(json.dumps(result), flush=True)
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": report.machine(), "load_before": os.getloadavg()[0],
                               "seconds": args.seconds, "concurrency": args.concurrency,
                               "rows": []}
    with tempfile.TemporaryDirectory(prefix="shoal-scaling-bench-") as tmp:
        for http_workers, instances in SETTINGS:
            results["rows"].append(run_setting(pathlib.Path(tmp), http_workers, instances,
                                               args.concurrency, args.seconds))
    results["load_after"] = os.getloadavg()[0]
    return results


def median_costs(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Each role's CPU µs per request, the median over the settings (the same work per
    request in each; the median keeps one disturbed run out)."""
    return {name: statistics.median(row[f"{name}_cpu_us"] for row in rows)
            for name in ("broker", "frontend", "worker")}


def projection(costs: dict[str, float], cores: int) -> float:
    """req/s on ``cores`` cores from CPU µs per request: the broker's one thread caps it; the
    other cores serve the frontends and workers (the clients run elsewhere)."""
    broker_cap = 1e6 / max(costs["broker"], 1e-9)
    others = costs["frontend"] + costs["worker"]
    return min(broker_cap, (cores - 1) * 1e6 / max(others, 1e-9))


def render(results: dict[str, Any], command: str) -> str:
    rows = results["rows"]
    base = rows[0]["requests_per_s"] or 1.0
    lines = [BEGIN, "## Scaling: the broker's ceiling, frontends and instances", "",
             f"Command: `{command}`. Machine: {results['machine']['cores']} cores, "
             f"{results['machine']['cpu']}; 1-minute load average "
             f"{results['load_before']:.1f} before, {results['load_after']:.1f} after "
             "(indicative only: a shared machine, and the load generator shares its cores).", "",
             f"`{MODEL}` (python, returns its input, dynamic batching up to 64, no delay), JSON "
             f"over HTTP, {results['concurrency']} closed-loop clients, "
             f"{results['seconds']:g} s per setting. CPU µs per request = the processes' CPU "
             "time in the window / requests served.", "",
             "| --http-workers | instances | req/s | vs 1/1 | p50 ms | p99 ms | mean batch "
             "| broker µs/req | frontends µs/req | workers µs/req | client µs/req "
             "| broker ceiling req/s |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(
            f"| {row['http_workers']} | {row['instances']} | {row['requests_per_s']:.0f} | "
            f"{row['requests_per_s'] / base:.2f} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | "
            f"{row['mean_batch']:.1f} | {row['broker_cpu_us']:.0f} | "
            f"{row['frontend_cpu_us']:.0f} | {row['worker_cpu_us']:.0f} | "
            f"{row['client_cpu_us']:.0f} | {1e6 / max(row['broker_cpu_us'], 1e-9):,.0f} |")
    costs = median_costs(rows)
    lines += ["", f"Median CPU µs per request over the settings: broker {costs['broker']:.0f}, "
              f"frontend {costs['frontend']:.0f}, worker {costs['worker']:.0f}. Projection "
              "(the broker's one thread caps throughput at 1e6 / broker µs; the other cores run "
              "frontends and workers; clients elsewhere): "
              + ", ".join(f"{cores} cores ~ {projection(costs, cores):,.0f} req/s"
                          for cores in (2, 4, 16, 64)) + ".", END]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--no-write", action="store_true", help="print, leave RESULTS.md")
    args = parser.parse_args()
    results = run(args)
    out = servers.BENCH / "out"
    out.mkdir(exist_ok=True)
    (out / "scaling_results.json").write_text(json.dumps(results, indent=2))
    section = render(results, "python -m bench.scaling_bench")
    print(section)
    if not args.no_write:
        write_marked_section(RESULTS, BEGIN, END, section)


if __name__ == "__main__":
    main()
