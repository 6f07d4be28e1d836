"""The process table: roles from real command lines, figures sampled from a real process
tree (a CPU-bound child, a sleeping child with a grandchild), frontend restart counting."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import msgspec
import psutil
import pytest

from shoal.messages import WorkerSpec
from shoal.ops.processes import FrontendRestarts, ProcessTable, classify
from shoal.settings import WorkerSettings

PY = sys.executable


def worker_argv(model: str = "mlp", instance: str = "mlp_0", kind: str = "CPU",
                device_id: int = 0) -> list[str]:
    spec = WorkerSpec(identity=f"{model}:1:{instance}:7", model_name=model, model_version=1,
                      model_dir="/m", version_dir="/m/1", backend="pytorch", config_json="{}",
                      instance_name=instance, kind=kind, device_id=device_id,
                      broker_endpoint="ipc:///x", arena_prefix="/shoal-abc-w7-",
                      settings=WorkerSettings())
    return [PY, "-m", "shoal.workers", msgspec.json.encode(spec).decode()]


def test_roles_from_command_lines() -> None:
    assert classify([PY, "-m", "shoal", "serve"], 10, is_root=True).key == "supervisor"
    assert classify([PY, "-m", "shoal.broker", "{}", "5"], 11, is_root=False).role == "broker"
    frontend = classify([PY, "-m", "shoal.frontend", "{}", "2"], 12, is_root=False)
    assert (frontend.role, frontend.key, frontend.frontend_index) == ("frontend", "frontend 2", 2)
    worker = classify(worker_argv(), 13, is_root=False)
    assert (worker.role, worker.model, worker.version, worker.instance, worker.device) == (
        "worker", "mlp", 1, "mlp_0", "cpu")
    assert worker.key == "worker mlp:1:mlp_0@cpu"
    assert worker.arena_prefix == "/shoal-abc-w7-"
    gpu = classify(worker_argv(kind="GPU", device_id=1), 14, is_root=False)
    assert gpu.device == "gpu:1" and gpu.key.endswith("@gpu:1")
    helper = classify([PY, "-m", "shoal.workers.autocomplete", "/m/1/model.py"], 15, False)
    assert helper.role == "autocomplete"
    other = classify(["/usr/bin/nvidia-smi"], 16, is_root=False)
    assert (other.role, other.label) == ("other", "nvidia-smi")
    broken = classify([PY, "-m", "shoal.workers", "not json"], 17, is_root=False)
    assert broken.role == "other"


def test_frontend_restarts_count_pid_changes_per_index() -> None:
    restarts = FrontendRestarts()
    assert restarts.observe(1, 100) == 0
    assert restarts.observe(1, 100) == 0
    assert restarts.observe(1, 101) == 1
    assert restarts.observe(2, 200) == 0
    assert restarts.observe(1, 102) == 2


@pytest.fixture
def tree() -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    busy = subprocess.Popen([PY, "-c", "while True: pass"])
    parent = subprocess.Popen([PY, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', "
                               "'import time; time.sleep(60)']); time.sleep(60)"])
    try:
        yield busy, parent
    finally:
        for proc in (busy, parent):
            if proc.poll() is None:
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()
                proc.kill()
            proc.wait()


def test_sampling_a_real_process_tree(
        tree: tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]) -> None:
    busy, parent = tree
    table = ProcessTable(psutil.Process())
    deadline = time.monotonic() + 10
    while len(psutil.Process(parent.pid).children()) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    table.sample()
    time.sleep(1.0)
    rows = {row.pid: row for row in table.sample()}
    me = psutil.Process()
    assert rows[me.pid].role == "supervisor"  # the root of the table
    grandchild = psutil.Process(parent.pid).children()[0].pid
    assert {busy.pid, parent.pid, grandchild} <= rows.keys()
    hot = rows[busy.pid]
    # measured against the previous sample of the same object (a loaded machine gives the
    # spinning child only a share of a core: no fixed threshold beyond "clearly busy")
    assert hot.cpu_percent > 1.0
    assert rows[parent.pid].cpu_percent < hot.cpu_percent
    assert hot.rss_bytes > 1_000_000 and hot.threads >= 1 and hot.open_fds >= 3
    assert 0 < hot.uptime_s < 60
    assert rows[grandchild].ppid == parent.pid
    assert len({row.key for row in rows.values()}) == len(rows)  # keys are unique


def test_a_process_that_exits_leaves_the_table(
        tree: tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]) -> None:
    busy, _parent = tree
    table = ProcessTable(psutil.Process())
    assert busy.pid in {row.pid for row in table.sample()}
    busy.kill()
    busy.wait()
    assert busy.pid not in {row.pid for row in table.sample()}


def test_a_gone_root_gives_an_empty_table() -> None:
    child = subprocess.Popen([PY, "-c", "pass"])
    root = psutil.Process(child.pid)
    child.wait()
    assert ProcessTable(root).sample() == []
