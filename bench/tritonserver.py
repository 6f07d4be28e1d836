"""The real ``tritonserver`` (2.51, python backend only), as the peer that the differential
tests (tests/conformance), the Triton suites runner (bench/triton_suites/run.py) and the
side-by-side benchmark (bench/triton_bench.py) start.

It comes from the ``nvidia-pytriton`` 0.7.0 wheel, which the Makefile installs into the
virtualenv with ``--no-deps`` (the wheel pins numpy < 2; only its server files are used, its
Python package is never imported). Its python-backend stub embeds Debian's Python 3.11
(``libpython3.11.so.1.0``) and imports numpy from there (``python3-numpy``, which ``.ci/run``
installs with apt). ``unavailable_reason`` says in one line what is missing where it cannot run.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import pathlib
import shutil
import subprocess
from collections.abc import Sequence

STUB_PYTHON = "3.11"
SYSTEM_PYTHON = "/usr/bin/python3"
# what the python backend leaves in /dev/shm when it is killed
SHM_PREFIX = "triton_python_backend_shm_region"


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


def _library_dir() -> pathlib.Path:
    root = _distribution_root()
    assert root is not None
    return root / "nvidia_pytriton.libs"


def _stub_path() -> pathlib.Path:
    root = server_root()
    assert root is not None
    return root / "python_backend_stubs" / STUB_PYTHON / "triton_python_backend_stub"


@functools.cache
def unavailable_reason() -> str | None:
    """Why the real tritonserver cannot run here (None when it can)."""
    if server_root() is None:
        return ("the real tritonserver is not installed: `pip install --no-deps "
                "nvidia-pytriton==0.7.0` into the virtualenv (make setup does)")
    if not os.path.exists(SYSTEM_PYTHON):
        return f"tritonserver's python stub needs Debian's {SYSTEM_PYTHON} (apt python3)"
    probe = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import numpy, sys; print(sys.version_info[:2])"],
        capture_output=True, text=True, check=False,
    )
    if probe.returncode != 0:
        return f"{SYSTEM_PYTHON} cannot import numpy: apt install python3-numpy"
    if probe.stdout.strip() != "(3, 11)":
        return (f"tritonserver's python stub is built for Python {STUB_PYTHON}; "
                f"{SYSTEM_PYTHON} is {probe.stdout.strip()}")
    ldd = subprocess.run(["ldd", str(_stub_path())], capture_output=True, text=True,
                         check=False, env={**os.environ, "LD_LIBRARY_PATH": str(_library_dir())})
    if "not found" in ldd.stdout:
        missing = [line.split()[0] for line in ldd.stdout.splitlines() if "not found" in line]
        return f"tritonserver's python stub misses {', '.join(missing)} (apt libpython3.11)"
    return None


def _backend_directory(into: pathlib.Path) -> pathlib.Path:
    """A backends folder holding the python backend with its stub beside it (the wheel keeps
    the stubs apart, one per Python version; tritonserver looks beside the backend)."""
    root = server_root()
    assert root is not None
    python = into / "python"
    python.mkdir(parents=True, exist_ok=True)
    for item in (root / "backends" / "python").iterdir():
        if item.is_file():
            shutil.copy2(item, python / item.name)
    shutil.copy2(_stub_path(), python / "triton_python_backend_stub")
    return into


def command(repositories: Sequence[str | os.PathLike[str]], workdir: pathlib.Path,
            http_port: int, grpc_port: int, metrics_port: int, address: str = "127.0.0.1",
            extra_args: Sequence[str] = ()) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of a ``tritonserver`` over ``repositories`` on the given ports
    (its backends folder is written under ``workdir``). Call only where ``unavailable_reason()``
    is None."""
    root = server_root()
    assert root is not None, unavailable_reason()
    backends = _backend_directory(workdir / "backends")
    argv = [str(root / "bin" / "tritonserver"),
            *(f"--model-repository={r}" for r in repositories),
            f"--backend-directory={backends}",
            f"--http-port={http_port}", f"--http-address={address}",
            f"--grpc-port={grpc_port}", f"--grpc-address={address}",
            f"--metrics-port={metrics_port}", *extra_args]
    return argv, {**os.environ, "LD_LIBRARY_PATH": str(_library_dir())}


def backend_segments() -> set[str]:
    """The python backend's segments in /dev/shm now (take it before a start, and pass it to
    ``remove_backend_segments`` after the stop)."""
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(SHM_PREFIX)}
    except FileNotFoundError:
        return set()


def remove_backend_segments(before: set[str]) -> None:
    """Remove the python backend's segments that appeared since ``before`` (a killed server's
    stubs leave theirs behind)."""
    for name in backend_segments() - before:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join("/dev/shm", name))
