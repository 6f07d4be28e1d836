"""systemd integration (issue #13 part 6): a real ``shoal serve`` talking to a notification socket
the test binds (what systemd does for Type=notify): READY=1 only once the models loaded,
WATCHDOG=1 at WATCHDOG_USEC/2 while the broker's main loop answers and not while the broker is
stopped (SIGSTOP), STOPPING=1 and a clean exit on SIGTERM; the children do not inherit
NOTIFY_SOCKET. (Abstract sockets and the rules without WATCHDOG_USEC:
tests/server/test_sd_notify.py.)
Also: the unit passes
``systemd-analyze verify`` and its ``security`` exposure stays at or below 2.0; the install
script's plan and its DESTDIR staging."""

from __future__ import annotations

import contextlib
import itertools
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from tests.e2e.conftest import serving
from tests.e2e.models import copy_example
from tests.e2e.server import ShoalServer

ROOT = pathlib.Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "shoal.service"
INSTALL = ROOT / "deploy" / "install.sh"
MAX_EXPOSURE = 2.0
WATCHDOG_USEC = 1_000_000  # pings every 0.5 s
BROKER_FRESH_S = 3.0  # shoal.server.sd_notify.BROKER_FRESH_S
SETTLE_S = 2.5  # slack for a loaded 2-core machine on top of each bound

SLOW_LOADING_MODEL = """
import time

class TritonPythonModel:
    def initialize(self, args):
        time.sleep(1.5)
        with open({marker!r}, "w") as f:
            f.write(repr(time.monotonic()))  # CLOCK_MONOTONIC: one clock for every process

    def execute(self, requests):
        return []
"""


class ManagerSocket:
    """A datagram socket standing for systemd's notification socket; records every assignment
    it receives with its arrival time (time.monotonic())."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(0.1)
        self.received: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._closed:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            now = time.monotonic()
            with self._lock:
                self.received.extend((now, line) for line in data.decode().split("\n"))

    def times(self, assignment: str) -> list[float]:
        with self._lock:
            return [t for t, line in self.received if line == assignment]

    def lines(self, prefix: str = "") -> list[str]:
        with self._lock:
            return [line for _, line in self.received if line.startswith(prefix)]

    def wait_for(self, assignment: str, timeout: float, after: float = 0.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            arrived = [t for t in self.times(assignment) if t >= after]
            if arrived:
                return arrived[0]
            time.sleep(0.05)
        raise AssertionError(f"no {assignment} within {timeout} s; got {self.lines()}")

    def close(self) -> None:
        self._closed = True
        self._thread.join(timeout=2)
        self.sock.close()


@pytest.fixture
def notify_dir() -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="shoal-sd-"))  # short: AF_UNIX paths < 108 B
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _broker_pid(server: ShoalServer) -> int:
    for child in server.children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if "shoal.broker" in " ".join(child.cmdline()):
                return child.pid
    raise AssertionError("no broker process")


def test_ready_watchdog_and_stopping_follow_the_broker(
        tmp_path: pathlib.Path, notify_dir: pathlib.Path) -> None:
    marker = tmp_path / "loaded_at"
    model = tmp_path / "repo" / "slow_loading"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(textwrap.dedent("""
        name: "slow_loading"
        backend: "python"
        max_batch_size: 0
        input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }]
        output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }]
    """))
    (model / "1" / "model.py").write_text(SLOW_LOADING_MODEL.format(marker=str(marker)))
    copy_example(tmp_path / "repo", "add_sub")
    manager = ManagerSocket(str(notify_dir / "notify"))
    srv = ShoalServer([str(tmp_path / "repo")], env={
        "NOTIFY_SOCKET": manager.address, "WATCHDOG_USEC": str(WATCHDOG_USEC)})
    try:
        with serving(srv):
            # READY=1: once, and only after the slowest model finished loading
            ready_at = manager.wait_for("READY=1", timeout=30)
            assert ready_at >= float(marker.read_text())
            assert len(manager.times("READY=1")) == 1
            assert manager.lines("STATUS=")[0] == "STATUS=loading models"
            manager.wait_for("STATUS=serving 2 models", timeout=5)
            for child in srv.children():  # only the supervisor may notify
                with contextlib.suppress(psutil.NoSuchProcess):
                    assert "NOTIFY_SOCKET" not in child.environ(), child.cmdline()[:3]

            # WATCHDOG=1 every WATCHDOG_USEC / 2 while the broker answers
            window_start = time.monotonic()
            time.sleep(3.0)
            pings = [t for t in manager.times("WATCHDOG=1") if t >= window_start]
            assert 4 <= len(pings) <= 8, pings  # 6 expected
            assert max(b - a for a, b in itertools.pairwise(pings)) < 0.5 + SETTLE_S

            # a stopped broker: the pings stop within BROKER_FRESH_S (+ one interval)
            broker = _broker_pid(srv)
            os.kill(broker, signal.SIGSTOP)
            stopped_at = time.monotonic()
            try:
                manager.wait_for("STATUS=the broker is not answering; watchdog pings withheld",
                                 timeout=BROKER_FRESH_S + SETTLE_S, after=stopped_at)
                silent_from = time.monotonic()
                time.sleep(2.0)
                late = [t for t in manager.times("WATCHDOG=1") if t > silent_from]
                assert late == [], "pings went on while the broker was stopped"
                last = max(manager.times("WATCHDOG=1"))
                assert last - stopped_at <= BROKER_FRESH_S + SETTLE_S
            finally:
                os.kill(broker, signal.SIGCONT)
            resumed_at = time.monotonic()
            manager.wait_for("WATCHDOG=1", timeout=SETTLE_S, after=resumed_at)
            manager.wait_for("STATUS=serving 2 models", timeout=SETTLE_S, after=resumed_at)
            stop_sent = time.monotonic()
        # serving() sent SIGTERM and checked exit code 0, no segment and no process left
        manager.wait_for("STOPPING=1", timeout=1, after=stop_sent)
        assert "STATUS=stopping: draining in-flight requests" in manager.lines("STATUS=")
    finally:
        manager.close()


# ---------------------------------------------------------------------- the unit and installer

def _analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    return tool


def _unit_copy(directory: pathlib.Path) -> pathlib.Path:
    """The unit with ExecStart pointed at this checkout's shoal (verify checks it exists)."""
    shoal = ROOT / ".venv" / "bin" / "shoal"
    assert shoal.exists(), "the virtualenv's shoal entry point"
    copy = directory / "shoal.service"
    copy.write_text(UNIT.read_text().replace("/opt/shoal/venv/bin/shoal", str(shoal)))
    return copy


def test_the_unit_verifies(tmp_path: pathlib.Path) -> None:
    result = subprocess.run([_analyze(), "verify", str(_unit_copy(tmp_path))],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "shoal.service" not in result.stderr, result.stderr  # no warning about the unit


def test_the_units_exposure_is_at_most_two(tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [_analyze(), "security", "--offline=true", "--no-pager", str(_unit_copy(tmp_path))],
        capture_output=True, text=True, timeout=60)
    match = re.search(r"Overall exposure level for shoal\.service: (\d+\.\d)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout
    readme = (ROOT / "README.md").read_text()
    assert f"exposure {match.group(1)}" in readme, "the README states the current score"


def test_install_script_plan(tmp_path: pathlib.Path) -> None:
    assert subprocess.run(["bash", "-n", str(INSTALL)], timeout=30).returncode == 0
    if shutil.which("shellcheck"):
        lint = subprocess.run(["shellcheck", str(INSTALL)], capture_output=True, text=True,
                              timeout=60)
        assert lint.returncode == 0, lint.stdout
    env = {**os.environ, "PREFIX": "/srv/shoal", "MODEL_REPOSITORY": "/srv/models"}
    plan = subprocess.run([str(INSTALL), "--dry-run"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert plan.returncode == 0, plan.stderr
    steps = [line for line in plan.stdout.splitlines() if line.startswith("+ ")]
    order = ["-m venv /srv/shoal/venv", "pip install --quiet --upgrade pip", "torch==2.13.0",
             f"pip install --quiet {ROOT}", "install -d -m 0750 /srv/models",
             "write /etc/systemd/system/shoal.service", "systemctl daemon-reload",
             "systemctl enable --now shoal.service"]
    positions = [next(i for i, s in enumerate(steps) if fragment in s) for fragment in order]
    assert positions == sorted(positions), steps  # torch before shoal, the unit before systemctl
    if subprocess.run(["id", "-u", "shoal"], capture_output=True).returncode != 0:
        assert steps[0].startswith("+ useradd --system"), steps
    assert not pathlib.Path("/srv/shoal/venv").exists()  # a dry run changes nothing


def test_install_script_stages_into_destdir(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "DESTDIR": str(tmp_path), "PREFIX": "/srv/shoal",
           "MODEL_REPOSITORY": "/srv/models"}
    run = subprocess.run([str(INSTALL), "--no-venv"], capture_output=True, text=True, env=env,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert "# skipped (DESTDIR): systemctl daemon-reload" in run.stdout
    unit = (tmp_path / "etc/systemd/system/shoal.service").read_text()
    assert "ExecStart=/srv/shoal/venv/bin/shoal serve --model-repository /srv/models " in unit
    assert "\nWorkingDirectory=/srv/shoal\n" in unit
    assert (tmp_path / "srv/models").is_dir()
    assert oct((tmp_path / "srv/models").stat().st_mode & 0o777) == "0o750"
