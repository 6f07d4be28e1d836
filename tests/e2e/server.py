"""Start and stop a real ``shoal serve`` process tree for end-to-end tests."""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

import httpx
import psutil

_LISTEN_PORTS = range(20000, 32768)  # below Linux's ephemeral range (32768-60999 by default)
_START_ATTEMPTS = 3
# log files of servers not stopped through ``stop`` (one that was expected to exit by itself,
# or killed): removed when the test process ends, so no run leaves them in /tmp (a failing
# test already carries the log's tail in its error)
_LOGS: set[str] = set()


@atexit.register
def _remove_logs() -> None:
    for path in list(_LOGS):
        with contextlib.suppress(OSError):
            os.unlink(path)
    _LOGS.clear()


def free_port() -> int:
    """A port nobody listens on now, chosen below the ephemeral range: a port the kernel hands
    out for outgoing connections (bind to port 0) can be taken by any client's connect before
    the server binds it."""
    for _ in range(100):
        port = random.choice(_LISTEN_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


class ShoalServer:
    """A ``shoal serve`` process tree on free ports (or on ``ports``: (HTTP, metrics, gRPC),
    e.g. another server's). ``start`` waits for readiness."""

    def __init__(
        self,
        repositories: Sequence[str],
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        ports: tuple[int, int, int] | None = None,
    ) -> None:
        self._repositories = list(repositories)
        self._extra_args = list(extra_args)
        self._fixed_ports = ports
        self._choose_ports()
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = ""

    def _choose_ports(self) -> None:
        if self._fixed_ports is not None:
            self.http_port, self.metrics_port, self.grpc_port = self._fixed_ports
        else:
            self.http_port, self.metrics_port, self.grpc_port = (free_port() for _ in range(3))
        self.args = [
            sys.executable,
            "-m",
            "shoal",
            "serve",
            *(f"--model-repository={r}" for r in self._repositories),
            f"--http-port={self.http_port}",
            f"--metrics-port={self.metrics_port}",
            f"--grpc-port={self.grpc_port}",
            "--grpc-address=127.0.0.1",
            "--http-address=127.0.0.1",
            *self._extra_args,
        ]

    @property
    def ports(self) -> tuple[int, int, int]:
        return self.http_port, self.metrics_port, self.grpc_port

    @property
    def url(self) -> str:
        return f"localhost:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self, wait_ready: bool = True, timeout: float = 60.0) -> ShoalServer:
        """Start the server (and wait until it is ready). A port taken between choosing it and
        binding it (another process on the machine) gets new ports and another start."""
        for attempt in range(_START_ATTEMPTS):
            self._launch()
            if not wait_ready:
                return self
            try:
                self.wait_ready(timeout)
                return self
            except RuntimeError:
                port_taken = "address already in use" in self.log().lower()
                if attempt + 1 == _START_ATTEMPTS or not port_taken or self._fixed_ports:
                    raise
                self.stop()
                self._choose_ports()
        return self

    def _launch(self) -> None:
        import tempfile

        log = tempfile.NamedTemporaryFile(prefix="shoal-e2e-", suffix=".log", delete=False)  # noqa: SIM115 (closed below, kept for the child)
        self.log_path = log.name
        _LOGS.add(log.name)
        self.process = subprocess.Popen(
            self.args, stdout=log, stderr=subprocess.STDOUT, env=self.env
        )
        log.close()

    # headers of the readiness probe (e.g. a restricted health endpoint's credentials)
    ready_headers: dict[str, str] = {}  # read-only: a subclass replaces it

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"shoal exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.base}/v2/health/ready", headers=self.ready_headers,
                             timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"shoal not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-6000:]
        except OSError:
            return ""

    def children(self) -> list[psutil.Process]:
        assert self.process is not None
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def frontend_pids(self) -> list[int]:
        pids = []
        for child in self.children():
            with contextlib.suppress(psutil.NoSuchProcess):
                if "shoal.frontend" in " ".join(child.cmdline()):
                    pids.append(child.pid)
        return pids

    def worker_pids(self, model: str | None = None) -> list[int]:
        pids = []
        for child in self.children():
            try:
                cmd = " ".join(child.cmdline())
            except psutil.NoSuchProcess:
                continue
            if (
                "shoal.workers" in cmd
                and "autocomplete" not in cmd
                and (model is None or f'"model_name":"{model}"' in cmd)
            ):
                pids.append(child.pid)
        return pids

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code (kills the tree if it hangs)."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill_tree()
                raise
        code = self.process.returncode
        with contextlib.suppress(OSError):
            os.unlink(self.log_path)
        _LOGS.discard(self.log_path)
        return code

    def kill_tree(self) -> None:
        """SIGKILL the supervisor and every descendant as one event: all are stopped first, so
        none sees another die and cleans up after it (the supervisor removes a dead frontend's
        arena within 100 ms, which a slow kill loop on a loaded machine would give it)."""
        assert self.process is not None
        procs = [*self.children()]
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(self.process.pid))
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.suspend()
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(procs, timeout=10)


def instance_of(children: list[psutil.Process]) -> str:
    """The one server instance id the processes ``children`` belong to."""
    from tests.conftest import instance_of_process

    ids = {found for child in children
           if (found := instance_of_process(" ".join(child.cmdline()))) is not None}
    (instance_id,) = ids
    return instance_id


def instance_files(instance_id: str) -> list[str]:
    """What is left in /dev/shm of server instance ``instance_id`` (segments, its lock)."""
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"shoal-{instance_id}"))
