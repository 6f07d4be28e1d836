"""What watching the server costs: requests/s of closed-loop clients on a model that does real
compute, with the ops dashboard closed vs open. From the repository root:

    make bench-dashboard      # = .venv/bin/python -m bench.dashboard_bench; writes RESULTS.md
    .venv/bin/python -m bench.dashboard_bench --seconds 3 --rounds 1 --no-write   # a smoke run

Serves examples/model_repository's ``mlp`` (TorchScript 256 -> 64 -> 16, dynamic batching, one
intra-op thread) with ``shoal serve`` (one frontend). C clients (default 8) run a closed loop
over raw HTTP/1.1 keep-alive connections with the binary tensor extension (bench/loadgen.py's
request format). Phases alternate, ``--rounds`` times: **closed** (nobody looks at the
dashboard) and **open** (one client polls ``/dashboard/api/stats`` every second, as ``shoal top``
does, and one holds the page's live feed ``/dashboard/api/stream``). Each phase lasts
``--seconds``; alternating spreads slow drifts of the machine over both.

The sampler itself runs in both phases (it is always on in frontend 0): "open" measures what
the viewers add. The sampler's own cost is reported from its documents (``sample_cpu_ms``: CPU
time of each 1 Hz sample), and frontend 0's CPU per phase from psutil.

Writes the section between the dashboard-benchmark markers of bench/RESULTS.md (the rest of the
file is kept) and bench/out/dashboard_results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import pathlib
import platform
import statistics
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import psutil

from bench import loadgen, report, servers
from bench.sections import write_marked_section

BEGIN, END = "<!-- dashboard-benchmark:begin -->", "<!-- dashboard-benchmark:end -->"
RESULTS = servers.BENCH / "RESULTS.md"
ROWS = 1
FEATURES = 256


def mlp_request(port: int) -> bytes:
    """One pre-encoded binary-extension request for ``mlp`` (ROWS x 256 FP32)."""
    header = json.dumps({
        "inputs": [{"name": "INPUT__0", "shape": [ROWS, FEATURES], "datatype": "FP32",
                    "parameters": {"binary_data_size": ROWS * FEATURES * 4}}],
        "outputs": [{"name": "OUTPUT__0", "parameters": {"binary_data": True}}]}).encode()
    body = header + bytes(ROWS * FEATURES * 4)
    return loadgen.build_request(f"127.0.0.1:{port}", "/v2/models/mlp/infer", body,
                                 [f"Inference-Header-Content-Length: {len(header)}"])


# ---------------------------------------------------------------------------------------------
# Load


async def closed_loop(port: int, request: bytes, seconds: float, clients: int
                      ) -> tuple[list[float], int]:
    """Latencies (s) of the 200 answers and the count of other answers."""
    latencies: list[float] = []
    errors: list[int] = []
    stop_at = time.perf_counter() + seconds
    await asyncio.gather(*(loadgen.connection("127.0.0.1", port, request, stop_at, latencies,
                                              errors) for _ in range(clients)))
    return latencies, len(errors)


@dataclass
class Viewers:
    """A poller of /dashboard/api/stats (1 Hz) and a reader of the live feed, on threads."""

    metrics_port: int
    polls: int = 0
    poll_failures: list[str] = field(default_factory=list)
    events: int = 0
    sample_cpu_ms: list[float] = field(default_factory=list)
    sample_ms: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _feed: http.client.HTTPConnection | None = None
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Viewers:
        self._threads = [threading.Thread(target=self._poll, daemon=True),
                         threading.Thread(target=self._follow, daemon=True)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._feed is not None and self._feed.sock is not None:
            with contextlib.suppress(OSError):
                self._feed.sock.shutdown(2)
        for thread in self._threads:
            thread.join(timeout=10)

    def _poll(self) -> None:
        url = f"http://127.0.0.1:{self.metrics_port}/dashboard/api/stats"
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=5) as reply:
                    document = json.loads(reply.read())
                self.polls += 1
                self.sample_cpu_ms.append(float(document["sample_cpu_ms"]))
                self.sample_ms.append(float(document["sample_ms"]))
            except (OSError, ValueError, KeyError) as exc:
                self.poll_failures.append(repr(exc))
            self._stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))

    def _follow(self) -> None:
        self._feed = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=30)
        try:
            self._feed.request("GET", "/dashboard/api/stream")
            reply = self._feed.getresponse()
            while not self._stop.is_set():
                line = reply.fp.readline()
                if not line:
                    break
                if line.startswith(b"data: "):
                    self.events += 1
        except (OSError, http.client.HTTPException):
            pass  # closed at the phase's end
        finally:
            self._feed.close()


# ---------------------------------------------------------------------------------------------
# Phases


def cpu_seconds(process: psutil.Process) -> float:
    with contextlib.suppress(psutil.Error):
        times = process.cpu_times()
        return float(times.user + times.system)
    return 0.0


def server_processes(server: servers.Server) -> tuple[psutil.Process | None, list[psutil.Process]]:
    """(frontend 0, every process of the server)."""
    everything = server.processes()
    frontend = next((p for p in everything
                     if "shoal.frontend" in " ".join(p.cmdline())), None)
    return frontend, everything


def system_busy_s() -> float:
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + getattr(t, "irq", 0.0)
                 + getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0))


def run_phase(kind: str, server: servers.Server, request: bytes, seconds: float,
              clients: int) -> dict[str, Any]:
    frontend, everything = server_processes(server)
    me = psutil.Process()
    cpu_before = {p.pid: cpu_seconds(p) for p in everything}
    busy_before, mine_before = system_busy_s(), cpu_seconds(me)
    viewers = Viewers(server.extra["metrics"]) if kind == "open" else None
    started = time.perf_counter()
    with viewers if viewers is not None else contextlib.nullcontext():
        latencies, errors = asyncio.run(closed_loop(server.port, request, seconds, clients))
    elapsed = time.perf_counter() - started
    cpu_after = {p.pid: cpu_seconds(p) for p in everything}
    server_s = sum(cpu_after[p] - cpu_before.get(p, 0.0) for p in cpu_after)
    # everything busy on the machine minus the server and this process: other people's work
    other_s = (system_busy_s() - busy_before) - server_s - (cpu_seconds(me) - mine_before)
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3 \
            if latencies else float("nan")

    phase: dict[str, Any] = {
        "kind": kind, "seconds": elapsed, "requests": len(latencies),
        "requests_per_s": len(latencies) / elapsed, "p50_ms": pct(0.5), "p99_ms": pct(0.99),
        "errors": errors,
        "frontend0_cores": ((cpu_after.get(frontend.pid, 0.0) - cpu_before.get(frontend.pid, 0.0))
                            / elapsed) if frontend is not None else float("nan"),
        "server_cores": server_s / elapsed, "other_cores": max(0.0, other_s / elapsed),
    }
    if viewers is not None:
        phase.update(polls=viewers.polls, poll_failures=viewers.poll_failures[:5],
                     feed_events=viewers.events, sample_cpu_ms=viewers.sample_cpu_ms,
                     sample_ms=viewers.sample_ms)
    return phase


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "machine": report.machine(), "python": platform.python_version(),
        "shoal": shoal_revision(), "clients": args.clients, "seconds": args.seconds,
        "rounds": args.rounds, "load_before": os.getloadavg()[0], "phases": []}
    with tempfile.TemporaryDirectory(prefix="shoal-dashboard-bench-") as tmp:
        server = servers.start_shoal(pathlib.Path(tmp) / "shoal", delay_us=1000)
        try:
            request = mlp_request(server.port)
            asyncio.run(closed_loop(server.port, request, args.warmup_seconds, args.clients))
            for _ in range(args.rounds):
                for kind in ("closed", "open"):
                    phase = run_phase(kind, server, request, args.seconds, args.clients)
                    print(f"{kind:6s} {phase['requests_per_s']:8.1f} req/s  p50 "
                          f"{phase['p50_ms']:.2f} ms  p99 {phase['p99_ms']:.2f} ms  frontend 0 "
                          f"{phase['frontend0_cores']:.3f} cores", flush=True)
                    results["phases"].append(phase)
        finally:
            server.stop()
    results["load_after"] = os.getloadavg()[0]
    return results


def shoal_revision() -> str:
    import subprocess

    def git(*command: str) -> str:
        return subprocess.run(["git", *command], capture_output=True, text=True, check=False,
                              cwd=servers.ROOT).stdout.strip()

    return (git("rev-parse", "--short", "HEAD") or "?") + (
        "+dirty" if git("status", "--porcelain", "--", "shoal") else "")


# ---------------------------------------------------------------------------------------------
# Report


def summarize(results: dict[str, Any]) -> dict[str, Any]:
    def of(kind: str) -> list[dict[str, Any]]:
        return [p for p in results["phases"] if p["kind"] == kind]

    def mean(values: list[float]) -> float:
        return statistics.fmean(values) if values else float("nan")

    closed, opened = of("closed"), of("open")
    summary: dict[str, Any] = {}
    for kind, phases in (("closed", closed), ("open", opened)):
        summary[kind] = {key: mean([p[key] for p in phases]) for key in
                         ("requests_per_s", "p50_ms", "p99_ms", "frontend0_cores",
                          "server_cores", "other_cores")}
        summary[kind]["errors"] = sum(p["errors"] for p in phases)
    pairs = [o["requests_per_s"] / c["requests_per_s"] - 1
             for c, o in zip(closed, opened, strict=False) if c["requests_per_s"]]
    summary["pair_changes"] = pairs
    cpu = sorted(x for p in opened for x in p.get("sample_cpu_ms", []))
    wall = sorted(x for p in opened for x in p.get("sample_ms", []))
    summary["sample_cpu_ms"] = {"median": statistics.median(cpu) if cpu else float("nan"),
                                "max": cpu[-1] if cpu else float("nan"), "count": len(cpu)}
    summary["sample_ms_median"] = statistics.median(wall) if wall else float("nan")
    summary["polls"] = sum(p.get("polls", 0) for p in opened)
    summary["poll_failures"] = sum(len(p.get("poll_failures", [])) for p in opened)
    summary["feed_events"] = sum(p.get("feed_events", 0) for p in opened)
    return summary


def render(results: dict[str, Any], command: str) -> str:
    m, s = results["machine"], summarize(results)
    closed, opened = s["closed"], s["open"]
    change = opened["requests_per_s"] / closed["requests_per_s"] - 1
    lines = [
        BEGIN, "## Ops dashboard: closed vs open", "",
        f"Command (from the repository root): `{command}`", "",
        f"Machine: {m['cores']} cores, {m['cpu']}, {m['memory_gib']} GiB; Python "
        f"{results['python']}, shoal {results['shoal']}; 1-minute load average "
        f"{results['load_before']:.1f} before the run, {results['load_after']:.1f} after.", "",
        "Model: examples/model_repository `mlp` (TorchScript 256 → 64 → 16, dynamic batching, "
        f"one intra-op thread), {ROWS} row per request. Load: {results['clients']} closed-loop "
        "clients, raw HTTP/1.1 keep-alive, binary tensor extension. Phases alternate closed / "
        f"open, {results['rounds']} rounds of {results['seconds']:.0f} s each. Closed: nobody "
        "looks at the dashboard (the 1 Hz sampler still runs: it is always on in frontend 0). "
        "Open: one client polls `/dashboard/api/stats` every second and one holds the live feed "
        "`/dashboard/api/stream`.", "",
        "| dashboard | req/s | p50 ms | p99 ms | frontend 0 CPU (cores) | server CPU (cores) "
        "| other work (cores) | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, row in (("closed", closed), ("open", opened)):
        lines.append(f"| {kind} | {row['requests_per_s']:,.0f} | {row['p50_ms']:.2f} | "
                     f"{row['p99_ms']:.2f} | {row['frontend0_cores']:.3f} | "
                     f"{row['server_cores']:.2f} | {row['other_cores']:.2f} | "
                     f"{row['errors']} |")
    pairs = ", ".join(f"{x:+.1%}" for x in s["pair_changes"])
    cpu = s["sample_cpu_ms"]
    lines += [
        "", "Analysis:", "",
        f"- Throughput with the dashboard open: {change:+.1%} against closed (mean of the "
        f"phases; per round, open vs the closed phase before it: {pairs}).",
        f"- The sampler's own work (psutil over the process tree, the /dev/shm scan, the "
        f"figures) took {cpu['median']:.2f} ms of CPU per sample (median of {cpu['count']}, "
        f"max {cpu['max']:.2f}), i.e. {cpu['median'] / 10:.2f}% of one core at 1 Hz; a sample "
        f"took {s['sample_ms_median']:.1f} ms wall (median), the wait for the broker's "
        "statistics included.",
        f"- The viewers: {s['polls']} polls answered ({s['poll_failures']} failed), "
        f"{s['feed_events']} live-feed events received; each hands out bytes the sampler "
        "encoded once per second.",
        "- Other work on the machine (all busy CPU minus the server and this benchmark): "
        f"{closed['other_cores']:.2f} cores in the closed phases, {opened['other_cores']:.2f} in "
        "the open ones; more than a few tenths make the comparison noise.",
        END,
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8, help="closed-loop connections")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=3, help="closed/open pairs")
    parser.add_argument("--warmup-seconds", type=float, default=3.0)
    parser.add_argument("--from-json", type=str, help="render a previous run's results")
    parser.add_argument("--no-write", action="store_true", help="print, leave RESULTS.md")
    args = parser.parse_args()
    out = servers.BENCH / "out"
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
    else:
        results = run(args)
        defaults = (args.clients, args.seconds, args.rounds) == (8, 20.0, 3)
        results["command"] = "make bench-dashboard" + ("" if defaults else (
            f" BENCH_DASHBOARD_ARGS='--clients {args.clients} --seconds {args.seconds:g} "
            f"--rounds {args.rounds}'"))
        out.mkdir(exist_ok=True)
        (out / "dashboard_results.json").write_text(json.dumps(results, indent=2))
    section = render(results, results["command"])
    print(section)
    if not args.no_write:
        write_marked_section(RESULTS, BEGIN, END, section)


if __name__ == "__main__":
    main()
