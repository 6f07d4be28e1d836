"""``shoal serve`` as pid 1 of its pid namespace, as a container's entrypoint without an init
runs it (``docker run`` without ``--init``, every Kubernetes container): it serves, and stops
clean on SIGTERM. Its children see pid 1 as their parent and must not take that for a dead
parent (before: every broker stopped itself at start, "killed by SIGUSR1")."""

from __future__ import annotations

import pathlib
import shutil
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from tests.conftest import orphan_segments, shoal_segments
from tests.e2e.models import copy_example
from tests.e2e.server import free_port


def _pid_namespaces_allowed() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True, check=False)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _pid_namespaces_allowed(),
                                reason="needs unshare(1) and the right to make a pid namespace")


def test_a_server_that_is_pid_1_serves_and_stops_clean(tmp_path: pathlib.Path) -> None:
    copy_example(tmp_path / "repo", "add_sub")
    http, grpc, metrics = free_port(), free_port(), free_port()
    segments_before = shoal_segments()
    log = (tmp_path / "server.log").open("wb")
    wrapper = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
         sys.executable, "-m", "shoal", "serve", f"--model-repository={tmp_path / 'repo'}",
         f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
         "--http-address=127.0.0.1", "--grpc-address=127.0.0.1"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        ready = False
        while time.monotonic() < deadline and wrapper.poll() is None and not ready:
            try:
                ready = httpx.get(f"http://127.0.0.1:{http}/v2/health/ready").status_code == 200
            except httpx.HTTPError:
                time.sleep(0.2)
        text = (tmp_path / "server.log").read_text()
        assert ready, f"not ready as pid 1:\n{text}"
        body = {"inputs": [{"name": n, "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}
                           for n in ("INPUT0", "INPUT1")]}
        r = httpx.post(f"http://127.0.0.1:{http}/v2/models/add_sub/infer", json=body)
        assert r.status_code == 200, r.text
        (supervisor,) = psutil.Process(wrapper.pid).children()
        supervisor.send_signal(signal.SIGTERM)
        assert wrapper.wait(timeout=60) == 0, (tmp_path / "server.log").read_text()
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()
        log.close()
    deadline = time.monotonic() + 5
    while orphan_segments(segments_before) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not orphan_segments(segments_before)
