"""The real ``tritonserver`` (2.51, python backend only) as a test peer.

It comes from the ``nvidia-pytriton`` 0.7.0 wheel, which the Makefile installs into the test
virtualenv with ``--no-deps`` (the wheel pins numpy < 2; only its server files are used, its
Python package is never imported). Its python-backend stub embeds Debian's Python 3.11
(``libpython3.11.so.1.0``) and imports numpy from there (``python3-numpy``, which ``.ci/run``
installs with apt). ``unavailable_reason`` says, in one line, what is missing where it cannot
run, so the conformance tests skip saying why instead of failing.

Contract of ``RealTriton``: ``start`` returns once ``/v2/health/ready`` answers 200 (or raises
with the log's tail); ``stop`` ends the process tree and removes what the python backend left in
``/dev/shm`` (its ``triton_python_backend_shm_region_*`` segments) that appeared while it ran.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence

import httpx

from tests.e2e.server import free_port

_STUB_PYTHON = "3.11"
_SYSTEM_PYTHON = "/usr/bin/python3"
_SHM_PREFIX = "triton_python_backend_shm_region"


@functools.cache
def _distribution_root() -> pathlib.Path | None:
    try:
        dist = importlib.metadata.distribution("nvidia-pytriton")
    except importlib.metadata.PackageNotFoundError:
        return None
    return pathlib.Path(str(dist.locate_file("")))


def server_root() -> pathlib.Path | None:
    """``pytriton/tritonserver`` of the installed wheel, or None."""
    root = _distribution_root()
    if root is None:
        return None
    path = root / "pytriton" / "tritonserver"
    return path if (path / "bin" / "tritonserver").is_file() else None


def library_dir() -> pathlib.Path | None:
    root = _distribution_root()
    return None if root is None else root / "nvidia_pytriton.libs"


@functools.cache
def unavailable_reason() -> str | None:
    """Why the real tritonserver cannot run here (None when it can)."""
    if server_root() is None:
        return ("the real tritonserver is not installed: `pip install --no-deps "
                "nvidia-pytriton==0.7.0` into the test virtualenv (make setup does)")
    if not os.path.exists(_SYSTEM_PYTHON):
        return f"tritonserver's python stub needs Debian's {_SYSTEM_PYTHON} (apt python3)"
    probe = subprocess.run(
        [_SYSTEM_PYTHON, "-c", "import numpy, sys; print(sys.version_info[:2])"],
        capture_output=True, text=True, check=False,
    )
    if probe.returncode != 0:
        return f"{_SYSTEM_PYTHON} cannot import numpy: apt install python3-numpy"
    if probe.stdout.strip() != "(3, 11)":
        return (f"tritonserver's python stub is built for Python {_STUB_PYTHON}; "
                f"{_SYSTEM_PYTHON} is {probe.stdout.strip()}")
    stub = _stub_path()
    libs = library_dir()
    ldd = subprocess.run(["ldd", str(stub)], capture_output=True, text=True, check=False,
                         env={**os.environ, "LD_LIBRARY_PATH": str(libs)})
    if "not found" in ldd.stdout:
        missing = [line.split()[0] for line in ldd.stdout.splitlines() if "not found" in line]
        return f"tritonserver's python stub misses {', '.join(missing)} (apt libpython3.11)"
    return None


def _stub_path() -> pathlib.Path:
    root = server_root()
    assert root is not None
    return root / "python_backend_stubs" / _STUB_PYTHON / "triton_python_backend_stub"


def _backend_directory(into: pathlib.Path) -> pathlib.Path:
    """A backends folder holding the python backend with its stub beside it (the wheel keeps
    the stubs apart, one per Python version; tritonserver looks beside the backend)."""
    root = server_root()
    assert root is not None
    python = into / "python"
    python.mkdir(parents=True)
    for item in (root / "backends" / "python").iterdir():
        if item.is_file():
            shutil.copy2(item, python / item.name)
    shutil.copy2(_stub_path(), python / "triton_python_backend_stub")
    return into


def _backend_shm() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(_SHM_PREFIX)}
    except FileNotFoundError:
        return set()


class RealTriton:
    """One ``tritonserver`` process over ``repositories`` on free ports."""

    def __init__(self, repositories: Sequence[str], extra_args: Sequence[str] = ()) -> None:
        self._repositories = list(repositories)
        self._extra_args = list(extra_args)
        self.http_port, self.grpc_port, self.metrics_port = (free_port() for _ in range(3))
        self.process: subprocess.Popen[bytes] | None = None
        self._workdir = pathlib.Path(tempfile.mkdtemp(prefix="shoal-triton-"))
        self._log_path = self._workdir / "tritonserver.log"
        self._shm_before: set[str] = set()

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
        root = server_root()
        libs = library_dir()
        assert root is not None and libs is not None, unavailable_reason()
        backends = _backend_directory(self._workdir / "backends")
        self._shm_before = _backend_shm()
        args = [
            str(root / "bin" / "tritonserver"),
            *(f"--model-repository={r}" for r in self._repositories),
            f"--backend-directory={backends}",
            f"--http-port={self.http_port}", "--http-address=127.0.0.1",
            f"--grpc-port={self.grpc_port}", "--grpc-address=127.0.0.1",
            f"--metrics-port={self.metrics_port}",
            *self._extra_args,
        ]
        env = {**os.environ, "LD_LIBRARY_PATH": str(libs)}
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
        for name in _backend_shm() - self._shm_before:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join("/dev/shm", name))
        shutil.rmtree(self._workdir, ignore_errors=True)
