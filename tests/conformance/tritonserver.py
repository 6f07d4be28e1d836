"""The real ``tritonserver`` 2.51 as a test peer (bench/tritonserver.py finds and launches
it; ``unavailable_reason`` says why it cannot run here, so the conformance tests skip saying so).

Contract of ``RealTriton``: ``start`` returns once ``/v2/health/ready`` answers 200 (or raises
with the log's tail); ``stop`` ends the process tree and removes what the python backend left in
``/dev/shm`` (its ``triton_python_backend_shm_region_*`` segments) that appeared while it ran.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence

import httpx

from bench import tritonserver
from bench.tritonserver import unavailable_reason
from tests.e2e.server import free_port

__all__ = ["RealTriton", "unavailable_reason"]


class RealTriton:
    """One ``tritonserver`` process over ``repositories`` on free ports."""

    def __init__(self, repositories: Sequence[str], extra_args: Sequence[str] = ()) -> None:
        self._repositories = list(repositories)
        self._extra_args = list(extra_args)
        self.http_port, self.grpc_port, self.metrics_port = (free_port() for _ in range(3))
        self.process: subprocess.Popen[bytes] | None = None
        self._workdir = pathlib.Path(tempfile.mkdtemp(prefix="shoal-triton-"))
        self._log_path = self._workdir / "tritonserver.log"
        self._segments_before: set[str] = set()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self, timeout: float = 90.0) -> RealTriton:
        args, env = tritonserver.command(self._repositories, self._workdir, self.http_port,
                                         self.grpc_port, self.metrics_port,
                                         extra_args=self._extra_args)
        self._segments_before = tritonserver.backend_segments()
        with open(self._log_path, "wb") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.process.returncode}:\n"
                                   f"{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base}/v2/health/ready", timeout=1).status_code == 200:
                    return self
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"tritonserver not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self._log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        if self.process is not None:
            # the python stubs run in the server's session: none may outlive it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        tritonserver.remove_backend_segments(self._segments_before)
        shutil.rmtree(self._workdir, ignore_errors=True)
