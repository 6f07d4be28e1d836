"""Model reload under load: how long ``POST /v2/repository/models/M/load`` with a config override
takes while N closed-loop clients keep inferring, and what the reload does to their latency.
From the repository root:

    make bench-reload     # = .venv/bin/python -m bench.reload_bench

Builds a seeded TorchScript MLP (FP32 [1024] -> 3072 -> 3072 -> [64], 12.8 M parameters, one
intra-op thread, dynamic batching up to 8 rows; a few ms per batch-1 call on a small CPU) in a
temporary repository and starts ``shoal serve --model-control-mode=explicit
--load-model=mlp_reload``. C clients (default 16) run a closed loop over raw HTTP/1.1 keep-alive
connections with the binary tensor extension (bench/loadgen.py's request format), every answer
is checked against the in-process result. Phases, one load throughout:

1. steady state (``--steady-seconds``, default 10): requests/s, p50, p99, max;
2. ``--reloads`` (default 5) reloads with a config override that flips ``instance_group.count``
   between 1 and 2 (tritonclient ``load_model(name, config=...)``), ``--gap-seconds`` of load
   between them. Each is timed from the load call to its return (the new generation ready and
   serving) and to the moment the old generation's worker processes have exited (drained).
   Requests in flight at any moment of a reload window (load call -> old workers gone) are
   counted as "during reload"; the others of the phase as "between reloads".

The longest time with no request completed (per reload, and where it began) shows a stall at the
switch as opposed to CPU contention; ``--warmup-count N`` adds a model_warmup (N executions of a
random batch-1 sample) so new instances run their first, cold executions before they are ready.

Every failed request (non-200 status, connection error, wrong answer) is counted and its text
kept. Writes the section between the reload-benchmark markers of bench/RESULTS.md (the rest of
the file is kept) and bench/out/reload_results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil
import torch

from bench import loadgen, report, servers
from bench.sections import write_marked_section

MODEL = "mlp_reload"
DIMS = (1024, 3072, 3072, 64)
MAX_BATCH = 8
QUEUE_DELAY_US = 500
BEGIN, END = "<!-- reload-benchmark:begin -->", "<!-- reload-benchmark:end -->"
RESULTS = servers.BENCH / "RESULTS.md"


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(a, b) for a, b in itertools.pairwise(DIMS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = torch.relu(x)
        return x


def model_config(count: int, warmup: int = 0) -> dict[str, Any]:
    """The model's config as the load API's JSON (Triton's ModelConfig field names). ``warmup``:
    executions of a batch-1 random sample before the instance is ready (0 = no model_warmup)."""
    config: dict[str, Any] = {
        "name": MODEL, "platform": "pytorch_libtorch", "max_batch_size": MAX_BATCH,
        "input": [{"name": "INPUT__0", "data_type": "TYPE_FP32", "dims": [DIMS[0]]}],
        "output": [{"name": "OUTPUT__0", "data_type": "TYPE_FP32", "dims": [DIMS[-1]]}],
        "dynamic_batching": {"max_queue_delay_microseconds": QUEUE_DELAY_US},
        "instance_group": [{"kind": "KIND_CPU", "count": count}],
        "parameters": {"INTRA_OP_THREAD_COUNT": {"string_value": "1"}},
    }
    if warmup:
        config["model_warmup"] = [{
            "name": "random", "batch_size": 1, "count": warmup,
            "inputs": {"INPUT__0": {"data_type": "TYPE_FP32", "dims": [DIMS[0]],
                                    "random_data": True}}}]
    return config


def config_pbtxt(config: dict[str, Any]) -> str:
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    return str(text_format.MessageToString(
        json_format.ParseDict(config, model_config_pb2.ModelConfig())))


def build_repository(root: pathlib.Path, warmup: int = 0
                     ) -> tuple[pathlib.Path, torch.jit.ScriptModule]:
    torch.manual_seed(0)
    module = torch.jit.script(MLP().eval())
    model_dir = root / "repo" / MODEL
    (model_dir / "1").mkdir(parents=True)
    module.save(str(model_dir / "1" / "model.pt"))  # type: ignore[no-untyped-call]
    (model_dir / "config.pbtxt").write_text(config_pbtxt(model_config(1, warmup)))
    return root / "repo", module


def in_process_ms(module: torch.jit.ScriptModule, batch: int, repeat: int = 40) -> float:
    """Median ms of one call of the model on ``batch`` rows, one thread (the worker's setting)."""
    x = torch.randn(batch, DIMS[0])
    samples = []
    with torch.inference_mode():
        for _ in range(5):
            module(x)
        for _ in range(repeat):
            start = time.perf_counter()
            module(x)
            samples.append(time.perf_counter() - start)
    return float(np.median(samples) * 1e3)


@dataclass
class Server:
    base: servers.Server

    @property
    def http_port(self) -> int:
        return self.base.port

    def worker_pids(self) -> set[int]:
        """Worker processes of the benchmark's model (every generation still alive)."""
        pids = set()
        for child in self.base.processes()[1:]:
            with contextlib.suppress(psutil.Error):
                cmd = " ".join(child.cmdline())
                if "shoal.workers" in cmd and "autocomplete" not in cmd and MODEL in cmd:
                    pids.add(child.pid)
        return pids


@contextlib.contextmanager
def shoal_server(repo: pathlib.Path, root: pathlib.Path) -> Iterator[Server]:
    workdir = root / "server"
    workdir.mkdir()
    server = servers.launch_shoal(repo, workdir, ["--model-control-mode=explicit",
                                                  f"--load-model={MODEL}"], MODEL)
    try:
        yield Server(server)
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------
# Load: closed loop, every request recorded with its start and end


@dataclass
class Sample:
    start: float
    end: float
    error: str = ""  # "" = a 200 with the right answer


@dataclass
class Load:
    request: bytes
    expected: np.ndarray
    host: str
    port: int
    samples: list[Sample] = field(default_factory=list)
    stop: bool = False


def parse_output(head: bytes, body: bytes) -> np.ndarray:
    """OUTPUT__0 of a binary-extension response (the header's JSON, then the raw tensor)."""
    header_length = len(body)
    for line in head.split(b"\r\n"):
        if line[:32].lower() == b"inference-header-content-length:":
            header_length = int(line[32:])
    header = json.loads(body[:header_length])
    size = int(header["outputs"][0]["parameters"]["binary_data_size"])
    return np.frombuffer(body[header_length:header_length + size], dtype=np.float32)


async def read_reply(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    return int(head[9:12]), head, await reader.readexactly(length)


async def client(load: Load) -> None:
    """One closed-loop connection; a broken connection is recorded and opened again."""
    writer: asyncio.StreamWriter | None = None
    reader: asyncio.StreamReader | None = None
    while not load.stop:
        start = time.perf_counter()
        try:
            if writer is None or reader is None:
                reader, writer = await asyncio.open_connection(load.host, load.port)
            writer.write(load.request)
            status, head, body = await read_reply(reader)
            if status != 200:
                error = f"HTTP {status}: {body[:300].decode(errors='replace')}"
            elif not np.allclose(parse_output(head, body), load.expected, rtol=1e-3,
                                 atol=1e-4):
                error = "wrong answer"
            else:
                error = ""
        except (OSError, asyncio.IncompleteReadError, ValueError, KeyError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            if writer is not None:
                writer.close()
            reader = writer = None
        load.samples.append(Sample(start, time.perf_counter(), error))
    if writer is not None:
        writer.close()


# ---------------------------------------------------------------------------------------------
# Reloads


@dataclass
class Reload:
    count_from: int
    count_to: int
    start: float
    wall_start: float = 0.0  # time.time() of the load call, to place the server log's lines
    returned: float = 0.0
    drained: float = 0.0
    error: str = ""
    old_pids: list[int] = field(default_factory=list)
    new_pids: list[int] = field(default_factory=list)
    start_cpu_s: list[float] = field(default_factory=list)  # per new worker, at the return


def reload_once(server: Server, count_from: int, count_to: int, warmup: int = 0,
                drain_timeout: float = 120.0) -> Reload:
    """Load with the override, then wait until the old generation's workers are gone."""
    import tritonclient.http as httpclient

    old = server.worker_pids()
    config = json.dumps(model_config(count_to, warmup))
    c = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}",
                                         network_timeout=600, connection_timeout=600)
    result = Reload(count_from, count_to, time.perf_counter(), time.time(), old_pids=sorted(old))
    try:
        c.load_model(MODEL, config=config)
    except Exception as exc:  # reported, never hidden
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.returned = time.perf_counter()
        c.close()
    for pid in server.worker_pids() - old:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            result.start_cpu_s.append(t.user + t.system)
    # a failed load keeps the serving generation: nothing to wait for
    deadline = time.monotonic() + (0.0 if result.error else drain_timeout)
    while time.monotonic() < deadline:
        alive = server.worker_pids()
        if not alive & old:
            result.new_pids = sorted(alive)
            break
        time.sleep(0.05)
    result.drained = time.perf_counter()
    return result


_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?"
                       r"(spawned worker \S+ \(pid (\d+)\)|instance \S+ ready \(pid (\d+)\))")


def worker_events(log: str) -> dict[int, dict[str, float]]:
    """pid -> {"spawned": t, "ready": t} (time.time() seconds) from the server's log."""
    events: dict[int, dict[str, float]] = {}
    for line in log.splitlines():
        found = _LOG_LINE.match(line)
        if not found:
            continue
        stamp = datetime.datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if found[3]:
            events.setdefault(int(found[3]), {})["spawned"] = stamp
        else:
            events.setdefault(int(found[4]), {})["ready"] = stamp
    return events


def add_worker_timings(reloads: list[dict[str, Any]], log: str) -> None:
    """Per reload: when the new workers were spawned and ready, from the load call."""
    events = worker_events(log)
    for r in reloads:
        new = [events[p] for p in r["new_pids"] if "spawned" in events.get(p, {})]
        if not new or any("ready" not in e for e in new):
            continue
        r["spawned_s"] = min(e["spawned"] for e in new) - r["wall_start"]
        r["ready_s"] = max(e["ready"] for e in new) - r["wall_start"]
        r["worker_start_s"] = [e["ready"] - e["spawned"] for e in new]


def start_parts(model_pt: pathlib.Path, repeat: int = 3) -> dict[str, float]:
    """What a new worker pays, measured here with the server idle: a fresh interpreter importing
    torch, and torch.jit.load of model.pt (median seconds)."""
    imports, loads = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        imports.append(time.perf_counter() - start)
        start = time.perf_counter()
        torch.jit.load(str(model_pt))  # type: ignore[no-untyped-call]
        loads.append(time.perf_counter() - start)
    return {"python_import_torch_s": float(np.median(imports)),
            "jit_load_s": float(np.median(loads))}


def system_busy_s() -> float:
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
                 + getattr(t, "steal", 0.0))


def tree_cpu_s(root: psutil.Process) -> float:
    """CPU seconds of this process and all its descendants (the server and its workers; reaped
    ones included, through their parents' children_* times)."""
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


@dataclass
class CpuMark:
    """A point in time for measuring the cores used by other work on the machine: everything
    busy minus this benchmark (this process, the server and its workers)."""
    at: float
    system: float
    ours: float


def cpu_mark() -> CpuMark:
    """The server is a child of this process: its tree holds the whole benchmark."""
    return CpuMark(time.perf_counter(), system_busy_s(), tree_cpu_s(psutil.Process()))


def other_cores(a: CpuMark, b: CpuMark) -> float:
    return max(0.0, (b.system - a.system) - (b.ours - a.ours)) / max(1e-9, b.at - a.at)


def idle_other_cores(seconds: float = 3.0) -> float:
    """Cores busy on the machine while this benchmark runs nothing."""
    start, busy = time.perf_counter(), system_busy_s()
    time.sleep(seconds)
    return (system_busy_s() - busy) / (time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------
# Statistics


def summary(samples: list[Sample], seconds: float) -> dict[str, Any]:
    ok = sorted(s.end - s.start for s in samples if not s.error)
    errors = [s.error for s in samples if s.error]

    def pct(p: float) -> float:
        return ok[min(len(ok) - 1, int(p * len(ok)))] * 1e3 if ok else float("nan")

    return {"requests": len(ok), "requests_per_s": len(ok) / seconds if seconds else 0.0,
            "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "max_ms": ok[-1] * 1e3 if ok else float("nan"), "failed": len(errors),
            "errors": sorted({e: errors.count(e) for e in errors}.items())}


def longest_gap(samples: list[Sample], start: float, end: float) -> tuple[float, float]:
    """Longest time inside [start, end] in which no request completed (a pause in serving
    shows here): (ms, seconds from ``start`` to the gap's beginning)."""
    ends = sorted([start, *(s.end for s in samples if start <= s.end <= end), end])
    length, at = max((b - a, a) for a, b in itertools.pairwise(ends))
    return length * 1e3, at - start


def overlaps(sample: Sample, start: float, end: float) -> bool:
    return sample.start < end and sample.end > start


async def run_load(args: argparse.Namespace, server: Server, expected: np.ndarray,
                   request: bytes) -> dict[str, Any]:
    load = Load(request, expected, "127.0.0.1", server.http_port)
    tasks = [asyncio.create_task(client(load)) for _ in range(args.concurrency)]
    await asyncio.sleep(args.warmup_seconds)
    mark_start = cpu_mark()
    steady_start = time.perf_counter()
    await asyncio.sleep(args.steady_seconds)
    steady_end = time.perf_counter()
    mark_steady = cpu_mark()
    reloads: list[Reload] = []
    count = 1
    for _ in range(args.reloads):
        target = 2 if count == 1 else 1
        reloads.append(await asyncio.to_thread(reload_once, server, count, target,
                                                 args.warmup_count))
        print(f"reload {count}->{target}: {json.dumps(reloads[-1].__dict__)}", flush=True)
        count = target
        await asyncio.sleep(args.gap_seconds)
    phase_end = time.perf_counter()
    mark_end = cpu_mark()
    load.stop = True
    await asyncio.gather(*tasks)

    samples = load.samples
    steady = [s for s in samples if s.start >= steady_start and s.end <= steady_end]
    phase = [s for s in samples if s.start >= steady_end and s.end <= phase_end]
    windows = [(r.start, r.drained) for r in reloads]
    during = [s for s in phase if any(overlaps(s, a, b) for a, b in windows)]
    between = [s for s in phase if not any(overlaps(s, a, b) for a, b in windows)]
    window_seconds = sum(b - a for a, b in windows)
    per_reload = []
    for r in reloads:
        inside = [s for s in phase if overlaps(s, r.start, r.drained)]
        row = summary(inside, r.drained - r.start)
        row["longest_gap_ms"], row["longest_gap_at_s"] = longest_gap(samples, r.start,
                                                                      r.drained)
        row.update({"from": r.count_from, "to": r.count_to,
                    "load_call_s": r.returned - r.start, "drained_s": r.drained - r.start,
                    "load_error": r.error, "old_pids": r.old_pids, "new_pids": r.new_pids,
                    "wall_start": r.wall_start, "start_cpu_s": r.start_cpu_s})
        per_reload.append(row)
    # Failures anywhere (warm-up and tail included): none may go unreported.
    failures = summary(samples, 1.0)
    steady_summary = summary(steady, steady_end - steady_start)
    steady_summary["longest_gap_ms"] = longest_gap(samples, steady_start, steady_end)[0]
    return {
        "steady": steady_summary,
        "during_reload": summary(during, window_seconds),
        "between_reloads": summary(between, phase_end - steady_end - window_seconds),
        "reloads": per_reload,
        "all_failed": failures["failed"], "all_errors": failures["errors"],
        "all_requests": len(samples),
        "other_cores": {"steady": other_cores(mark_start, mark_steady),
                        "reloads": other_cores(mark_steady, mark_end)},
    }


def encode_request(x: np.ndarray) -> bytes:
    header = json.dumps({"inputs": [{"name": "INPUT__0", "shape": list(x.shape),
                                     "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "OUTPUT__0",
                                      "parameters": {"binary_data": True}}]}).encode()
    return loadgen.build_request("127.0.0.1", f"/v2/models/{MODEL}/infer", header + x.tobytes(),
                                 [f"Inference-Header-Content-Length: {len(header)}"])


def shoal_revision() -> str:
    """HEAD's short hash, "+dirty" when shoal/ has changes not committed."""
    def git(*command: str) -> str:
        return subprocess.run(["git", *command], capture_output=True, text=True, check=False,
                              cwd=servers.ROOT).stdout.strip()

    try:
        return (git("rev-parse", "--short", "HEAD") or "?") + (
            "+dirty" if git("status", "--porcelain", "--", "shoal") else "")
    except OSError:
        return "?"


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)  # as the worker (INTRA_OP_THREAD_COUNT 1); the server needs the rest
    results: dict[str, Any] = {"machine": report.machine(), "python": platform.python_version(),
                               "torch": torch.__version__, "shoal": shoal_revision(),
                               "concurrency": args.concurrency,
                               "warmup_count": args.warmup_count,
                               "steady_seconds": args.steady_seconds,
                               "gap_seconds": args.gap_seconds, "reload_count": args.reloads,
                               "load_before": os.getloadavg()[0],
                               "other_cores_idle": idle_other_cores()}
    with tempfile.TemporaryDirectory(prefix="shoal-reload-bench-") as tmp:
        root = pathlib.Path(tmp)
        repo, module = build_repository(root, args.warmup_count)
        results["in_process_ms"] = {str(b): in_process_ms(module, b) for b in (1, MAX_BATCH)}
        results["start_parts"] = start_parts(repo / MODEL / "1" / "model.pt")
        x = np.random.default_rng(0).standard_normal((1, DIMS[0])).astype(np.float32)
        with torch.inference_mode():
            expected = module(torch.from_numpy(x)).numpy().reshape(-1)
        with shoal_server(repo, root) as server:
            results["initial_workers"] = sorted(server.worker_pids())
            results.update(asyncio.run(run_load(args, server, expected, encode_request(x))))
            log = server.base.log.read_text(errors="replace")
            add_worker_timings(results["reloads"], log)
            first = [worker_events(log).get(p, {}) for p in results["initial_workers"]]
            if first and all("spawned" in e and "ready" in e for e in first):
                results["cold_start_worker_s"] = max(e["ready"] - e["spawned"] for e in first)
            results["server_log_tail"] = log[-6000:]
        # the same in-process call again: the machine's speed (a VM's host can slow it unseen)
        results["in_process_ms_after"] = {str(b): in_process_ms(module, b)
                                          for b in (1, MAX_BATCH)}
    results["load_after"] = os.getloadavg()[0]
    return results


# ---------------------------------------------------------------------------------------------
# Report


def _row(name: str, r: dict[str, Any], seconds: str) -> str:
    return (f"| {name} | {seconds} | {r['requests']:,} | {r['requests_per_s']:,.0f} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} | {r['failed']} |")


def _s(r: dict[str, Any], key: str) -> str:
    return f"{r[key]:.2f}" if key in r else "—"


def analysis(results: dict[str, Any]) -> list[str]:
    """The run's reading, from its own numbers (the section is rewritten on every run)."""
    steady, during = results["steady"], results["during_reload"]
    reloads, parts = results["reloads"], results["start_parts"]
    calls = [r["load_call_s"] for r in reloads]
    starts = [t for r in reloads for t in r.get("worker_start_s", [])]
    before_spawn = [r["spawned_s"] for r in reloads if "spawned_s" in r]
    after_ready = [r["load_call_s"] - r["ready_s"] for r in reloads if "ready_s" in r]
    drains = [r["drained_s"] - r["load_call_s"] for r in reloads]
    ones = [r["load_call_s"] for r in reloads if r["to"] == 1]
    twos = [r["load_call_s"] for r in reloads if r["to"] == 2]
    med = float(np.median(calls))
    lines = [f"- Time to reload under load: median {med:.2f} s (min {min(calls):.2f}, max "
             f"{max(calls):.2f})"
             + (f"; to 1 instance {float(np.median(ones)):.2f} s, to 2 instances "
                f"{float(np.median(twos)):.2f} s (median)" if ones and twos else "") + "."]
    if starts and before_spawn and after_ready:
        cold = results.get("cold_start_worker_s")
        lines.append(
            f"- Where it goes (server log): {float(np.median(before_spawn)):.2f} s from the load "
            "call to the first new worker's spawn (config check, materialising the override), "
            f"then {float(np.median(starts)):.2f} s median from spawn to ready per new worker "
            f"(max {max(starts):.2f} s), then {float(np.median(after_ready)):.2f} s to the "
            "load call's return. The worker's start is the cost: a fresh interpreter importing "
            f"torch takes {parts['python_import_torch_s']:.2f} s and torch.jit.load of the model "
            f"{parts['jit_load_s'] * 1e3:.0f} ms on this machine with the server idle"
            + (f"; the first worker started in {cold:.2f} s with no load" if cold else "")
            + ". Under load the new worker competes with the serving one, the frontend, the "
            "broker and the load generator for the 2 cores, so it starts slower. The old "
            f"generation's workers were gone {float(np.median(drains)):.2f} s (median) after "
            "the load call returned.")
    ratio_p99 = during["p99_ms"] / steady["p99_ms"] if steady["p99_ms"] else float("nan")
    ratio_rps = during["requests_per_s"] / steady["requests_per_s"] if steady[
        "requests_per_s"] else float("nan")
    cpu = [t for r in reloads for t in r.get("start_cpu_s", [])]
    gaps = [r["longest_gap_ms"] for r in reloads]
    at_switch = [abs(r["longest_gap_at_s"] - r["load_call_s"]) < 0.25
                 or r["longest_gap_at_s"] < r["load_call_s"]
                 < r["longest_gap_at_s"] + r["longest_gap_ms"] / 1e3 for r in reloads]
    steady_gap = steady["longest_gap_ms"]
    stalls = ("- Stalls: the longest time with no request completed, per reload: "
              + ", ".join(f"{g:.0f}" for g in gaps) + f" ms ({steady_gap:.0f} ms in the steady "
              f"state); {sum(at_switch)} of {len(reloads)} began at the switch (within 0.25 s of "
              "the load call's return). ")
    if sum(at_switch) * 2 >= len(reloads) and float(np.median(gaps)) > 2 * steady_gap:
        stalls += ("A short hiccup when traffic moves to the new generation, whose workers run "
                   "their first executions cold"
                   + (" (this config has no model_warmup, and TorchScript optimises a module "
                      "during its first calls; `--warmup-count 3` runs those before the instance "
                      "is ready)." if not results.get("warmup_count") else "."))
    elif max(gaps) > 4 * steady_gap and max(gaps) > during["p99_ms"]:
        stalls += ("The longest gaps fall while the new workers start, away from the switch: "
                   "CPU starvation of the serving path rather than a stall of the reload.")
    elif sum(at_switch) * 2 >= len(reloads):
        stalls += ("Most began at the switch, but none is much longer than the steady state's "
                   "longest: a hiccup at the switch, if any, is within this run's noise.")
    else:
        stalls += "No stall beyond the CPU contention above."
    lines.append(
        f"- Latency cost: requests in flight during a reload had p50 {during['p50_ms']:.1f} ms "
        f"and p99 {during['p99_ms']:.1f} ms against {steady['p50_ms']:.1f} / "
        f"{steady['p99_ms']:.1f} ms in steady state (p99 x{ratio_p99:.1f}, max "
        f"{during['max_ms']:.0f} ms), and the server completed {ratio_rps:.0%} of the steady "
        "request rate over the reload windows."
        + (f" A new worker had used {float(np.median(cpu)):.1f} CPU-seconds (median) by the time "
           "the load call returned, nearly all of it its start (interpreter, torch import, model "
           "load), taken from the 2 cores that also run the serving "
           "worker, the frontend, the broker and this load generator; a reload to 2 instances "
           "starts two workers at once." if cpu else "")
        + " The old generation serves until the new one is ready, then traffic moves.")
    lines.append(stalls)
    failed = results["all_failed"]
    lines.append(f"- Failed requests: {failed} of {results['all_requests']:,}"
                 + (" (every answer was also checked against the in-process result)."
                    if not failed else " — see the error texts above."))
    other = results["other_cores"]
    disturbed = max(other.values()) > 0.2
    lines.append(
        "- Other work on the machine (all busy CPU minus this benchmark's processes): "
        f"{results['other_cores_idle']:.2f} cores just before the run, {other['steady']:.2f} "
        f"during the steady phase, {other['reloads']:.2f} during the reload phase"
        + ("; the run was disturbed by other work, read the absolute numbers with care."
           if disturbed else "."))
    before = results["in_process_ms"][str(MAX_BATCH)]
    after = results.get("in_process_ms_after", {}).get(str(MAX_BATCH))
    if after:
        drift = after / before - 1
        lines.append(
            f"- Machine speed: the in-process {MAX_BATCH}-row call took {before:.2f} ms before "
            f"the run and {after:.2f} ms after ({drift:+.0%})"
            + ("; the machine's speed changed during the run (a virtual machine's host can slow "
               "it without any process here showing it), so the numbers are noisy."
               if abs(drift) > 0.15 else "; no sign of a speed change."))
    return lines


def render(results: dict[str, Any], command: str) -> str:
    m, steady = results["machine"], results["steady"]
    during, between = results["during_reload"], results["between_reloads"]
    reloads = results["reloads"]
    ip = results["in_process_ms"]
    window = sum(r["drained_s"] for r in reloads)
    params = sum(a * b + b for a, b in itertools.pairwise(DIMS))
    lines = [
        BEGIN, "## Model reload under load", "",
        f"Command (from the repository root): `{command}`", "",
        f"Machine: {m['cores']} cores, {m['cpu']}, {m['memory_gib']} GiB; Python "
        f"{results['python']}, torch {results['torch']}, shoal {results.get('shoal', '?')}; "
        "1-minute load average "
        f"{results['load_before']:.1f} before the run.", "",
        f"Model: TorchScript MLP FP32 [{DIMS[0]}] → {DIMS[1]} → {DIMS[2]} → [{DIMS[-1]}] "
        f"({params / 1e6:.1f} M parameters, {params * 4 / 1e6:.0f} MB), one intra-op thread, "
        f"dynamic batching up to {MAX_BATCH} rows ({QUEUE_DELAY_US} µs queue delay), "
        + (f"model_warmup: {results['warmup_count']} executions of a random batch-1 sample"
           if results.get("warmup_count") else "no model_warmup") + "; in process "
        f"one call takes {ip['1']:.2f} ms for 1 row, {ip[str(MAX_BATCH)]:.2f} ms for "
        f"{MAX_BATCH}. Server: `shoal serve --model-control-mode=explicit "
        f"--load-model={MODEL}`. Load: {results['concurrency']} closed-loop clients, raw "
        "HTTP/1.1 keep-alive, binary tensor extension, every answer checked against the "
        f"in-process result. {results['reload_count']} reloads, each `load_model(name, "
        "config=...)` with an override that flips `instance_group.count` 1 ↔ 2, "
        f"{results['gap_seconds']:.0f} s of load between them. A request is \"during reload\" "
        "when it was in flight at any moment between the load call and the exit of the old "
        f"generation's last worker ({window:.1f} s in all).", "",
        "| phase | seconds | requests | req/s | p50 ms | p99 ms | max ms | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        _row("steady state (1 instance)", steady, f"{results['steady_seconds']:.0f}"),
        _row("during reloads", during, f"{window:.1f}"),
        _row("between reloads (1 or 2 instances)", between, "—"),
        "", "Per reload (seconds from the load call; spawn/ready of the new workers from the "
        "server log; longest gap: the longest time in the window in which no request "
        "completed, and when it began):", "",
        "| reload | load call returned | new workers spawned | new workers ready "
        "| old workers gone | requests | p50 ms | p99 ms | max ms | longest gap ms | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(reloads, 1):
        lines.append(f"| {i}: count {r['from']} → {r['to']} | {r['load_call_s']:.2f} | "
                     f"{_s(r, 'spawned_s')} | {_s(r, 'ready_s')} | {r['drained_s']:.2f} | "
                     f"{r['requests']:,} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                     f"{r['max_ms']:.1f} | {r['longest_gap_ms']:.0f} at "
                     f"{r['longest_gap_at_s']:.2f} | {r['failed']} |")
    load_errors = [r["load_error"] for r in reloads if r["load_error"]]
    if results["all_errors"] or load_errors:
        lines += ["", "Errors (count x text):", ""]
        lines += [f"- {n} x `{text}`" for text, n in results["all_errors"]]
        lines += [f"- load call: `{text}`" for text in load_errors]
    lines += ["", "Analysis:", "", *analysis(results), END]
    return "\n".join(lines) + "\n"


def write_section(section: str, path: pathlib.Path = RESULTS) -> None:
    """Replace the marked section, or append it after everything else."""
    write_marked_section(path, BEGIN, END, section)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop clients")
    parser.add_argument("--steady-seconds", type=float, default=10.0)
    parser.add_argument("--warmup-seconds", type=float, default=3.0)
    parser.add_argument("--reloads", type=int, default=5)
    parser.add_argument("--warmup-count", type=int, default=0,
                        help="model_warmup: executions of a batch-1 random sample before a new "
                        "instance is ready (0 = none, the default)")
    parser.add_argument("--gap-seconds", type=float, default=3.0,
                        help="load between the end of one reload and the next load call")
    parser.add_argument("--from-json", type=pathlib.Path,
                        help="render a previous run's results instead of measuring")
    parser.add_argument("--no-write", action="store_true", help="print, leave RESULTS.md")
    args = parser.parse_args()
    out = servers.BENCH / "out"
    if args.from_json:
        results = json.loads(args.from_json.read_text())
    else:
        results = run(args)
        options = (args.concurrency, args.steady_seconds, args.warmup_seconds, args.reloads,
                   args.gap_seconds, args.warmup_count)
        results["command"] = "make bench-reload" + (
            "" if options == (16, 10.0, 3.0, 5, 3.0, 0) else
            f" BENCH_RELOAD_ARGS='--concurrency {args.concurrency} --steady-seconds "
            f"{args.steady_seconds} --warmup-seconds {args.warmup_seconds} --reloads "
            f"{args.reloads} --gap-seconds {args.gap_seconds} --warmup-count "
            f"{args.warmup_count}'")
        out.mkdir(exist_ok=True)
        (out / "reload_results.json").write_text(json.dumps(results, indent=2))
    section = render(results, results["command"])
    print(section)
    if not args.no_write:
        write_section(section)


if __name__ == "__main__":
    main()
