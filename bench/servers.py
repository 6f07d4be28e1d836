"""Start and stop the servers the benchmark compares, each on free local ports."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field

import psutil

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
EXAMPLES = ROOT / "examples" / "model_repository"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(url)


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    workdir: pathlib.Path
    log: pathlib.Path
    extra: dict[str, int] = field(default_factory=dict)

    def processes(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def rss_mib(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for p in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                out[f"{p.pid} {' '.join(p.cmdline())[:60]}"] = p.memory_info().rss / 2**20
        return out

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                for p in self.processes():
                    p.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def shoal_repository(workdir: pathlib.Path, delay_us: int, realistic: bool = False
                     ) -> pathlib.Path:
    """The example MLP (its delay set to ``delay_us``), identity16, and with ``realistic`` the
    realistic MLP of bench/realistic.py."""
    repo = workdir / "repo"
    if realistic:
        from bench import realistic as realistic_model

        realistic_model.shoal_model(repo)
    shutil.copytree(EXAMPLES / "mlp", repo / "mlp")
    config = repo / "mlp" / "config.pbtxt"
    text = config.read_text()
    text = text.replace("max_queue_delay_microseconds: 1000",
                        f"max_queue_delay_microseconds: {delay_us}")
    config.write_text(text)
    return identity_repository(repo)


def identity_repository(repo: pathlib.Path) -> pathlib.Path:
    """``identity16`` into ``repo``: the example python identity model, FP32 [1, 16], no
    batching (a model the real tritonserver's python backend serves too)."""
    identity = repo / "identity16"
    (identity / "1").mkdir(parents=True)
    (identity / "config.pbtxt").write_text(
        'name: "identity16"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] }]\n'
        'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] }]\n')
    shutil.copy(EXAMPLES / "identity_fp32" / "1" / "model.py", identity / "1" / "model.py")
    return repo


def start_shoal(workdir: pathlib.Path, delay_us: int, http_workers: int = 1,
                realistic: bool = False) -> Server:
    workdir.mkdir(parents=True, exist_ok=True)
    repo = shoal_repository(workdir, delay_us, realistic)
    port, metrics, grpc = free_port(), free_port(), free_port()
    log = workdir / "shoal.log"
    shoal = ROOT / ".venv" / "bin" / "shoal"
    command = [str(shoal) if shoal.exists() else sys.executable, *([] if shoal.exists() else
               ["-m", "shoal"]), "serve", f"--model-repository={repo}", f"--http-port={port}",
               f"--metrics-port={metrics}", "--http-address=127.0.0.1",
               f"--grpc-port={grpc}", "--grpc-address=127.0.0.1",
               f"--http-workers={http_workers}"]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", process)
    return Server("shoal", port, process, workdir, log, {"metrics": metrics, "grpc": grpc})


def launch_shoal(repo: pathlib.Path, workdir: pathlib.Path, flags: Sequence[str],
                 ready_model: str) -> Server:
    """``shoal serve`` over ``repo`` on free loopback ports (HTTP, gRPC, metrics) with ``flags``,
    logging to ``workdir/shoal.log``; returns once ``ready_model`` is ready."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    shoal = ROOT / ".venv" / "bin" / "shoal"
    command = [*([str(shoal)] if shoal.exists() else [sys.executable, "-m", "shoal"]), "serve",
               f"--model-repository={repo}", f"--http-port={http}", f"--grpc-port={grpc}",
               f"--metrics-port={metrics}", "--http-address=127.0.0.1",
               "--grpc-address=127.0.0.1", *flags]
    log = workdir / "shoal.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    server = Server("shoal", http, process, workdir, log, {"metrics": metrics, "grpc": grpc})
    try:
        wait_ready(f"http://127.0.0.1:{http}/v2/models/{ready_model}/ready", process)
    except BaseException:  # not ready: stop it, keep the workdir (its log says why)
        process.terminate()
        process.wait(timeout=60)
        raise
    return server


def launch_checkout(checkout: pathlib.Path | None, repository: pathlib.Path,
                    root: pathlib.Path, env: dict[str, str] | None = None
                    ) -> tuple[Server, int]:
    """``shoal serve`` of ``repository`` on free loopback ports, run from the source tree
    ``checkout`` (its PYTHONPATH and working directory; None: this one) with ``env`` added
    (a PYTHONPATH there is put after the checkout's), logging to ``root/shoal.log``; returns
    once ready, with its HTTP port. For A/B benches of two trees."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    environment = dict(os.environ, **(env or {}))
    if checkout is not None:
        extra = (env or {}).get("PYTHONPATH")
        environment["PYTHONPATH"] = f"{checkout}:{extra}" if extra else str(checkout)
    command = [sys.executable, "-m", "shoal", "serve", f"--model-repository={repository}",
               f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
               "--http-address=127.0.0.1", "--grpc-address=127.0.0.1"]
    with open(root / "shoal.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   env=environment, cwd=checkout)
    running = Server("shoal", http, process, root, root / "shoal.log")
    try:
        wait_ready(f"http://127.0.0.1:{http}/v2/health/ready", process)
    except BaseException:
        running.stop()
        raise
    return running, http


def start_tritonserver(repo: pathlib.Path, workdir: pathlib.Path, ready_model: str) -> Server:
    """The real tritonserver 2.51 (bench/tritonserver.py) over ``repo`` on free loopback ports at
    its defaults, logging to ``workdir/tritonserver.log``; returns once ``ready_model`` is
    ready. Its python stubs run in its session, stopped with it."""
    from bench import tritonserver

    reason = tritonserver.unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    workdir.mkdir(parents=True, exist_ok=True)
    http, grpc, metrics = free_port(), free_port(), free_port()
    argv, env = tritonserver.command([repo], workdir, http, grpc, metrics)
    log = workdir / "tritonserver.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    server = Server("tritonserver", http, process, workdir, log,
                    {"metrics": metrics, "grpc": grpc})
    try:
        wait_ready(f"http://127.0.0.1:{http}/v2/models/{ready_model}/ready", process)
    except BaseException:
        process.terminate()
        process.wait(timeout=60)
        raise
    return server


def start_mlserver(workdir: pathlib.Path, venv: pathlib.Path, delay_us: int,
                   realistic: pathlib.Path | None = None) -> Server:
    """MLServer 1.7.1 with adaptive batching (max_batch_size 32, max_batch_time = shoal's delay)
    serving the same model.pt through bench/mlserver/runtimes.py; with ``realistic`` (that
    model.pt) also the realistic MLP of bench/realistic.py."""
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(BENCH / "mlserver" / "runtimes.py", workdir / "runtimes.py")
    port, grpc = free_port(), free_port()
    (workdir / "settings.json").write_text(json.dumps({
        "http_port": port, "grpc_port": grpc, "metrics_port": free_port(),
        "load_models_at_startup": True, "debug": False}))
    if realistic is not None:
        from bench import realistic as realistic_model

        (workdir / realistic_model.NAME).mkdir()
        (workdir / realistic_model.NAME / "model-settings.json").write_text(
            json.dumps(realistic_model.mlserver_settings(realistic)))
    mlp = workdir / "mlp"
    mlp.mkdir()
    (mlp / "model-settings.json").write_text(json.dumps({
        "name": "mlp", "implementation": "runtimes.TorchScriptRuntime",
        "max_batch_size": 32, "max_batch_time": delay_us / 1e6,
        "parameters": {"uri": str(EXAMPLES / "mlp" / "1" / "model.pt")}}))
    identity = workdir / "identity16"
    identity.mkdir()
    (identity / "model-settings.json").write_text(json.dumps({
        "name": "identity16", "implementation": "runtimes.IdentityRuntime"}))
    log = workdir / "mlserver.log"
    env = {**os.environ, "PYTHONPATH": str(workdir)}
    with open(log, "wb") as out:
        process = subprocess.Popen([str(venv / "bin" / "mlserver"), "start", str(workdir)],
                                   stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env=env)
    wait_ready(f"http://127.0.0.1:{port}/v2/models/mlp/ready", process)
    wait_ready(f"http://127.0.0.1:{port}/v2/models/identity16/ready", process)
    if realistic is not None:
        wait_ready(f"http://127.0.0.1:{port}/v2/models/mlp_large/ready", process)
    return Server("mlserver", port, process, workdir, log, {"grpc": grpc})


def ensure_mlserver_venv(venv: pathlib.Path) -> pathlib.Path:
    """MLServer 1.7.1 in its own environment (torch first so no CUDA build is pulled; MLServer
    1.7.1 needs uvloop<0.21 to start)."""
    if (venv / "bin" / "mlserver").exists():
        return venv
    if venv.is_symlink() and not venv.exists():  # a link to a virtualenv that is gone
        venv.unlink()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run([*pip, "mlserver==1.7.1", "uvloop<0.21"], check=True)
    return venv
