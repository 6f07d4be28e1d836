"""Chaos soak: many clients mixing every way of asking (HTTP JSON, HTTP binary, gRPC, system
shared memory, gRPC streams of a decoupled model) while a chaos thread SIGKILLs or SIGSTOPs a
random worker every ~10 s and reloads a model every minute. From the repository root:

    make bench-chaos                          # 30 minutes, writes its section of RESULTS.md
    .venv/bin/python -m bench.chaos_soak --minutes 2 --no-write

Serves a copy of examples/model_repository (identity_fp32: dynamic batching; mlp: TorchScript;
countdown: decoupled) with ``--model-control-mode=explicit --load-model=*``, client shared memory
allowed and a 2 s heartbeat timeout (a stopped worker is noticed by its silence).

What it checks, per request: exactly one answer (unary: one result or one error; a stream: its
responses in order and then exactly one end, a final flag or one error, and nothing after it), no
answer later than the client deadline (``DEADLINE_S``: a "hang"), every successful answer
correct. Per process: RSS of the supervisor, broker and frontend, and the server's /dev/shm bytes,
at the start and at the end. After the stop: no process of the server left.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import pathlib
import platform
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil  # type: ignore[import-untyped]
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from bench import servers
from bench.sections import write_marked_section

DEADLINE_S = 30.0
KINDS = ("json", "binary", "grpc", "shm", "stream", "mlp")
BEGIN, END = "<!-- chaos-soak:begin -->", "<!-- chaos-soak:end -->"
RESULTS = servers.BENCH / "RESULTS.md"


@dataclass
class Tally:
    """Outcomes, guarded by ``lock``. ``answers`` counts answers per request (must all be 1)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    answers: collections.Counter[int] = field(default_factory=collections.Counter)
    violations: list[str] = field(default_factory=list)

    def record(self, kind: str, answers: int, error: str = "", violation: str = "") -> None:
        with self.lock:
            self.answers[answers] += 1
            self.outcomes[f"{kind} {'error' if error else 'ok'}"] += 1
            if error:
                self.errors[error_class(error)] += 1
            if violation:
                self.violations.append(f"{kind}: {violation}")


def error_class(message: str) -> str:
    """A short class for an error text (the instance names and pids stripped)."""
    for needle, name in (("killed by signal", "worker killed mid-request"),
                         ("heartbeat was silent", "worker stopped (heartbeat)"),
                         ("was unloaded", "version unloaded while queued"),
                         ("not available", "model restarting / reloading"),
                         ("no available versions", "model restarting / reloading"),
                         ("not at ready state", "model restarting / reloading"),
                         ("timed out", "client deadline"), ("Deadline", "client deadline")):
        if needle in message:
            return name
    return message[:80]


class StreamSession:
    """One client thread's gRPC stream, kept across its stream requests (a client and a stream
    per request would leave threads behind in tritonclient); started again after a failure."""

    def __init__(self, url: str, index: int, graceful: bool = False) -> None:
        self.url = url
        self.index = index
        # graceful: a stream whose last request has ended is closed with the end-of-requests
        # sentinel (half-close) instead of a cancel; a broken stream is always cancelled
        self.graceful = graceful
        self.events: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self._client: Any = None
        self._ids = 0

    def next_id(self) -> str:
        self._ids += 1
        return f"{self.index}-{self._ids}"

    def client(self) -> Any:
        if self._client is None:
            self._client = grpcclient.InferenceServerClient(self.url)
            self._client.start_stream(
                callback=lambda result, error: self.events.put((result, error)))
        return self._client

    def reset(self, ended: bool = False) -> None:
        """A fresh stream next time; ``ended``: every request sent on this one has ended."""
        self.close(cancel=not (ended and self.graceful))
        self.events = queue.Queue()

    def close(self, cancel: bool = True) -> None:
        if self._client is not None:
            stream = getattr(self._client, "_stream", None)
            with contextlib.suppress(Exception):
                self._client.stop_stream(cancel_requests=cancel)
            # tritonclient (2.x, _infer_stream.py) skips the end-of-requests sentinel when it
            # cancels, so gRPC's thread that reads the request iterator blocks for good: one
            # leaked thread per cancelled stream (the harness grew to ~32,000 threads in 30
            # minutes). Give that thread its sentinel.
            if stream is not None:
                with contextlib.suppress(Exception):
                    stream._request_queue.put(None)
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None


@dataclass
class Soak:
    url: str
    grpc_url: str
    tally: Tally
    stop: threading.Event
    rng: random.Random
    graceful_stream_close: bool = False

    def client_loop(self, index: int) -> None:
        http = httpclient.InferenceServerClient(self.url, network_timeout=DEADLINE_S,
                                                connection_timeout=DEADLINE_S)
        grpc = grpcclient.InferenceServerClient(self.grpc_url)
        session = StreamSession(self.grpc_url, index, self.graceful_stream_close)
        region = f"/chaos-{os.getpid()}-{index}"
        handle = shm.create_shared_memory_region(f"chaos{index}", region, 64 * 4 * 2)
        registered = False
        rng = random.Random(index)
        try:
            while not self.stop.is_set():
                kind = rng.choice(KINDS)
                if kind == "shm" and not registered:
                    with contextlib.suppress(InferenceServerException):
                        http.register_system_shared_memory(f"chaos{index}", region, 64 * 4 * 2)
                        registered = True
                    if not registered:
                        continue
                self.one(kind, http, grpc, handle, index, rng, session)
        finally:
            http.close()
            grpc.close()
            session.close()
            shm.destroy_shared_memory_region(handle)

    def one(self, kind: str, http: Any, grpc: Any, handle: Any, index: int,
            rng: random.Random, session: StreamSession) -> None:
        started = time.monotonic()
        try:
            if kind == "stream":
                self.stream(session, rng)
                return
            ok = self.unary(kind, http, grpc, handle, index, rng)
            violation = "" if ok else "wrong answer"
            error = ""
        except InferenceServerException as exc:
            violation, error = "", str(exc) or "empty error"
        except Exception as exc:  # a transport failure is an answer too, but say which
            violation, error = "", f"{type(exc).__name__}: {exc}"
        if time.monotonic() - started > DEADLINE_S + 1:
            violation = f"answered after {time.monotonic() - started:.1f} s"
        self.tally.record(kind, 1, error, violation)

    def unary(self, kind: str, http: Any, grpc: Any, handle: Any, index: int,
              rng: random.Random) -> bool:
        rows = rng.randint(1, 4)
        if kind == "mlp":
            x = np.random.default_rng(index).standard_normal((rows, 256), dtype=np.float32)
            tensor = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=True)
            out = http.infer("mlp", [tensor]).as_numpy("OUTPUT__0")
            return bool(out is not None and out.shape == (rows, 16))
        x = np.full((rows, 16), float(index), dtype=np.float32)
        if kind == "grpc":
            tensor = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            out = grpc.infer("identity_fp32", [tensor], client_timeout=DEADLINE_S)
            return bool(np.array_equal(out.as_numpy("OUTPUT0"), x))
        tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        if kind == "shm":
            x = np.full((1, 16), float(index), dtype=np.float32)
            shm.set_shared_memory_region(handle, [x])
            tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
            tensor.set_shared_memory(f"chaos{index}", 64)
            output = httpclient.InferRequestedOutput("OUTPUT0")
            output.set_shared_memory(f"chaos{index}", 64, offset=256)
            http.infer("identity_fp32", [tensor], outputs=[output])
            got = shm.get_contents_as_numpy(handle, np.float32, [1, 16], offset=256)
            return bool(np.array_equal(got, x))
        tensor.set_data_from_numpy(x, binary_data=(kind == "binary"))
        out = http.infer("identity_fp32", [tensor])
        return bool(np.array_equal(out.as_numpy("OUTPUT0"), x))

    def stream(self, session: StreamSession, rng: random.Random) -> None:
        """One countdown request on the thread's stream (one request at a time, so every event
        is this request's): n responses in order, then exactly one end, and nothing after it."""
        n = rng.randint(1, 4)
        request_id = session.next_id()
        tensor = grpcclient.InferInput("START", [1], "INT32")
        tensor.set_data_from_numpy(np.array([n], np.int32))
        counts: list[int] = []
        ends, error, violation = 0, "", ""
        try:
            session.client().async_stream_infer("countdown", [tensor], request_id=request_id,
                                                enable_empty_final_response=True)
        except InferenceServerException as exc:  # the stream broke (e.g. its frontend died)
            session.reset()
            self.tally.record("stream", 1, str(exc) or "empty error")
            return
        deadline = time.monotonic() + DEADLINE_S
        while ends == 0 and time.monotonic() < deadline:
            try:
                result, failure = session.events.get(timeout=0.5)
            except queue.Empty:
                continue
            if failure is not None:
                ends, error = ends + 1, str(failure) or "empty error"
                continue
            response = result.get_response()
            if response.id != request_id:
                violation = f"an answer of request {response.id} after its end"
                continue
            if response.outputs:
                counts.append(int(result.as_numpy("COUNT")[0]))
            if response.parameters["triton_final_response"].bool_param:
                ends += 1
        time.sleep(0.05)  # anything after the end is a second answer
        while not session.events.empty():
            result, failure = session.events.get_nowait()
            if failure is None and result.get_response().id == request_id:
                ends += 1
        if ends == 0:
            violation = "no end within the deadline"
            session.reset()
        elif not error and not violation and counts != list(range(n - 1, -1, -1)):
            violation = f"responses {counts} for {n}"
        if error:
            session.reset(ended=ends > 0)  # an in-band error may leave the stream broken
        self.tally.record("stream", ends, error, violation)

    def chaos_loop(self, server: ShoalProcess, every_s: float, reload_s: float,
                   actions: collections.Counter[str]) -> None:
        next_reload = time.monotonic() + reload_s
        count = 1
        while not self.stop.wait(every_s * self.rng.uniform(0.5, 1.5)):
            workers = server.worker_pids()
            if workers:
                victim = self.rng.choice(workers)
                sig = self.rng.choice((signal.SIGKILL, signal.SIGSTOP))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, sig)
                    actions[sig.name] += 1
            if time.monotonic() >= next_reload:
                next_reload += reload_s
                count = 3 - count
                config = ('{"name": "identity_fp32", "backend": "python", "max_batch_size": 32, '
                          '"input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]}], '
                          '"output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", '
                          '"dims": [16]}], "dynamic_batching": {}, '
                          f'"instance_group": [{{"kind": "KIND_CPU", "count": {count}}}]}}')
                control = httpclient.InferenceServerClient(self.url, network_timeout=120)
                try:
                    control.load_model("identity_fp32", config=config)
                    actions["reload"] += 1
                except InferenceServerException as exc:
                    actions[f"reload failed: {exc}"] += 1
                finally:
                    control.close()


@dataclass
class ShoalProcess:
    process: subprocess.Popen[bytes]
    workdir: pathlib.Path
    instance: str = ""

    def tree(self) -> list[psutil.Process]:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        return []

    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.tree() if _is_worker(p)]

    def long_lived_rss(self, status_field: str = "VmRSS") -> dict[str, float]:
        """MiB per long-lived process (supervisor, broker, frontend) of a /proc status field:
        VmRSS (all resident pages), RssAnon (private heap: what a leak grows) or RssShmem (pages
        of shared-memory segments touched, e.g. arenas in use)."""
        out: dict[str, float] = {}
        for p in self.tree():
            with contextlib.suppress(psutil.NoSuchProcess, FileNotFoundError):
                cmd = " ".join(p.cmdline())
                role = ("broker" if "shoal.broker" in cmd else "frontend"
                        if "shoal.frontend" in cmd else "supervisor" if " serve " in cmd else "")
                if role:
                    out[role] = _status_kib(p.pid, status_field) / 1024
        return out

    def shm_bytes(self) -> int:
        total = 0
        for name in os.listdir("/dev/shm"):
            if self.instance and name.startswith(f"shoal-{self.instance}"):
                with contextlib.suppress(OSError):
                    total += os.stat(f"/dev/shm/{name}").st_blocks * 512
        return total


def _status_kib(pid: int, field: str) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _is_worker(p: psutil.Process) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        cmd = " ".join(p.cmdline())
        return "shoal.workers" in cmd and "autocomplete" not in cmd
    return False


def start_server(workdir: pathlib.Path) -> tuple[ShoalProcess, str, str]:
    repo = workdir / "repo"
    shutil.copytree(servers.EXAMPLES, repo)
    http_port, grpc_port, metrics_port = (servers.free_port() for _ in range(3))
    command = [sys.executable, "-m", "shoal", "serve", f"--model-repository={repo}",
               f"--http-port={http_port}", f"--grpc-port={grpc_port}",
               f"--metrics-port={metrics_port}", "--http-address=127.0.0.1",
               "--grpc-address=127.0.0.1", "--model-control-mode=explicit", "--load-model=*",
               "--allow-client-shm=true", "--worker-heartbeat-timeout-secs=2",
               "--exit-timeout-secs=5"]
    log = open(workdir / "shoal.log", "wb")  # noqa: SIM115 (the child keeps it)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    servers.wait_ready(f"http://127.0.0.1:{http_port}/v2/health/ready", process)
    server = ShoalProcess(process, workdir)
    for p in server.tree():
        match = [a for a in p.cmdline() if '"instance_id":"' in a]
        if match:
            server.instance = match[0].split('"instance_id":"')[1][:12]
            break
    return server, f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"


@dataclass
class SoakReport:
    minutes: float
    clients: int
    tally: Tally
    actions: collections.Counter[str]
    rss_start: dict[str, float]
    rss_end: dict[str, float]
    shm_start: int
    shm_end: int
    orphans: list[str]
    exit_code: int | None
    # role -> private heap (RssAnon) MiB at the start and after each tenth of the run
    anon_timeline: dict[str, list[float]] = field(default_factory=dict)
    graceful_stream_close: bool = False


def run_soak(minutes: float, clients: int = 32, chaos_every_s: float = 10.0,
             reload_every_s: float = 60.0, warmup_s: float = 5.0,
             graceful_stream_close: bool = False) -> SoakReport:
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="shoal-chaos-"))
    server, url, grpc_url = start_server(workdir)
    tally, stop = Tally(), threading.Event()
    soak = Soak(url, grpc_url, tally, stop, random.Random(0), graceful_stream_close)
    actions: collections.Counter[str] = collections.Counter()
    threads = [threading.Thread(target=soak.client_loop, args=(i,), daemon=True)
               for i in range(clients)]
    try:
        for t in threads:
            t.start()
        time.sleep(warmup_s)  # arenas and connections reach their working size first
        rss_start, shm_start = server.long_lived_rss(), server.shm_bytes()
        chaos = threading.Thread(target=soak.chaos_loop,
                                 args=(server, chaos_every_s, reload_every_s, actions),
                                 daemon=True)
        chaos.start()
        anon_timeline = {role: [mib] for role, mib in server.long_lived_rss("RssAnon").items()}
        for _ in range(10):  # the private heap's trend: a plateau is warm-up, a slope a leak
            time.sleep(minutes * 6)
            for role, mib in server.long_lived_rss("RssAnon").items():
                anon_timeline.setdefault(role, []).append(mib)
        stop.set()
        chaos.join(timeout=150)
        for t in threads:
            t.join(timeout=DEADLINE_S + 10)
        for pid in server.worker_pids():  # a SIGSTOPped worker the heartbeat has not yet seen
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        time.sleep(3)  # the last killed workers come back; arenas settle
        rss_end, shm_end = server.long_lived_rss(), server.shm_bytes()
        hung = [f"client thread {i}" for i, t in enumerate(threads) if t.is_alive()]
        tally.violations += [f"{h} still running after the end" for h in hung]
    finally:
        tree = server.tree()
        server.process.send_signal(signal.SIGTERM)
        try:
            exit_code: int | None = server.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            exit_code = None
        _gone, alive = psutil.wait_procs(tree, timeout=10)
        orphans = [f"{p.pid}" for p in alive]
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    return SoakReport(minutes, clients, tally, actions, rss_start, rss_end, shm_start, shm_end,
                      orphans, exit_code, anon_timeline, graceful_stream_close)


def render(r: SoakReport, command: str) -> str:
    total = sum(r.tally.answers.values())
    one = r.tally.answers.get(1, 0)
    ratio = sum(k * v for k, v in r.tally.answers.items()) / total if total else 0.0
    lines = [
        "## Chaos soak", "",
        f"Command (from the repository root): `{command}`", "",
        f"Machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}; "
        f"{r.clients} clients for {r.minutes:g} minutes over a copy of examples/model_repository "
        "(identity_fp32 dynamic batching, mlp TorchScript, countdown decoupled); requests mixed "
        f"evenly over {', '.join(KINDS)}; chaos: " + ", ".join(
            f"{k} x{v}" for k, v in sorted(r.actions.items())) + ". A stream whose request "
        "ended with an error is then " + ("closed gracefully (half-close)" if
                                          r.graceful_stream_close else "cancelled") +
        " and a new one opened.", "",
        "| figure | value |", "|---|---:|",
        f"| requests | {total:,} |",
        f"| answers per request | {ratio:.3f} ({one:,} with exactly one) |",
        f"| violations (wrong answer, late, second end, no end) | {len(r.tally.violations)} |",
        *(f"| {k} | {v:,} |" for k, v in sorted(r.tally.outcomes.items())),
        *(f"| error: {k} | {v:,} |" for k, v in r.tally.errors.most_common()),
        *(f"| RSS (all resident pages, arena pages in use included) {role} MiB start → end | "
          f"{r.rss_start.get(role, 0):.0f} → "
          f"{r.rss_end.get(role, 0):.0f} |" for role in ("supervisor", "broker", "frontend")),
        *(f"| private heap (RssAnon) {role} MiB, each tenth of the run | "
          f"{' → '.join(f'{v:.0f}' for v in r.anon_timeline.get(role, []))} |"
          for role in ("supervisor", "broker", "frontend")),
        f"| /dev/shm MiB start → end | {r.shm_start / 2**20:.1f} → {r.shm_end / 2**20:.1f} |",
        f"| orphan processes after the stop | {len(r.orphans)} |",
        f"| server exit code | {r.exit_code} |", "",
    ]
    if r.tally.violations:
        lines += ["Violations (first 10):", "", *(f"- {v}" for v in r.tally.violations[:10]), ""]
    return "\n".join(lines)


def write_section(section: str, path: pathlib.Path = RESULTS) -> None:
    """Replace the marked section of RESULTS.md, or append it."""
    write_marked_section(path, BEGIN, END, f"{BEGIN}\n{section.rstrip()}\n{END}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--no-write", action="store_true", help="print, do not touch RESULTS.md")
    parser.add_argument("--graceful-stream-close", action="store_true",
                        help="after an in-band error, close the stream with a half-close instead "
                             "of a cancel (grpcio's aio server leaks ~80 bytes of native memory "
                             "per stream a client cancels while the server awaits its next "
                             "request: grpc/grpc#43360)")
    args = parser.parse_args(argv)
    result = run_soak(args.minutes, args.clients,
                      graceful_stream_close=args.graceful_stream_close)
    plain = args.minutes == 30 and args.clients == 32 and not args.graceful_stream_close
    command = "make bench-chaos" if plain else (
        f".venv/bin/python -m bench.chaos_soak --minutes {args.minutes:g} --clients {args.clients}"
        + (" --graceful-stream-close" if args.graceful_stream_close else ""))
    text = render(result, command)
    print(text)
    if not args.no_write:
        write_section(text)
    return 0 if not result.tally.violations and not result.orphans else 1


if __name__ == "__main__":
    sys.exit(main())
