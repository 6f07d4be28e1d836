"""Restart safety (issue #12 part 2): a server whose supervisor was SIGKILLed while requests were
in flight must not stand in the way of a new server started at once on the same ports and
repository; its children drain while the new server serves, nothing of theirs is swept while
they live, and nothing of theirs is left afterwards. A port held by another process fails the
start with a message that names that process."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from shoal.shm.sweep import instance_alive
from tests.e2e.models import copy_example
from tests.e2e.server import ShoalServer, free_port, instance_files, instance_of

# "gated" answers Y = X once the gate file exists: the old server's requests stay in flight for
# as long as the test needs, however slowly the new server starts on a loaded machine
GATED_CONFIG = """
name: "gated"
backend: "python"
max_batch_size: 0
input [{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }]
output [{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }]
instance_group [{ kind: KIND_CPU count: 2 }]
"""
GATED_MODEL = """
import os, time
import triton_python_backend_utils as pb_utils

GATE = %r

class TritonPythonModel:
    def execute(self, requests):
        deadline = time.monotonic() + 120
        while not os.path.exists(GATE) and time.monotonic() < deadline:
            time.sleep(0.02)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy().copy())])
                for r in requests]
"""


@pytest.fixture
def small_repo(tmp_path: pathlib.Path) -> pathlib.Path:
    repo = tmp_path / "repo"
    copy_example(repo, "add_sub")
    (repo / "gated" / "1").mkdir(parents=True)
    (repo / "gated" / "config.pbtxt").write_text(GATED_CONFIG)
    (repo / "gated" / "1" / "model.py").write_text(GATED_MODEL % str(tmp_path / "gate"))
    return repo


def _wait_for(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def _add_sub_body() -> dict[str, object]:
    return {"inputs": [
        {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]}]}


def _gated_http(url: str, x: int, outcome: dict[str, object]) -> None:
    client = httpclient.InferenceServerClient(url, network_timeout=180)  # gevent: per thread
    inp = httpclient.InferInput("X", [1], "INT32")
    inp.set_data_from_numpy(np.array([x], np.int32))
    try:
        outcome["value"] = int(client.infer("gated", [inp]).as_numpy("Y")[0])
    except Exception as exc:  # recorded, asserted by the test
        outcome["error"] = str(exc)


def _gated_grpc(url: str, x: int, outcome: dict[str, object]) -> None:
    client = grpcclient.InferenceServerClient(url)
    inp = grpcclient.InferInput("X", [1], "INT32")
    inp.set_data_from_numpy(np.array([x], np.int32))
    try:
        outcome["value"] = int(client.infer("gated", [inp], client_timeout=180).as_numpy("Y")[0])
    except Exception as exc:  # recorded, asserted by the test
        outcome["error"] = str(exc)
    finally:
        client.close()


def test_new_server_starts_at_once_on_the_ports_of_a_killed_one_while_its_children_drain(
    small_repo: pathlib.Path, fresh_server_factory: list[ShoalServer]
) -> None:
    gate = small_repo.parent / "gate"
    old = ShoalServer([str(small_repo)], ["--exit-timeout-secs=150"]).start()
    fresh_server_factory.append(old)
    assert old.process is not None
    assert httpx.post(f"{old.base}/v2/models/add_sub/infer", json=_add_sub_body()).is_success
    old_children = old.children()  # broker, frontend, workers
    old_id = instance_of(old_children)
    (old_frontend,) = old.frontend_pids()
    running_http: dict[str, object] = {}
    running_grpc: dict[str, object] = {}
    queued: dict[str, object] = {}
    threads = [threading.Thread(target=_gated_http, args=(old.url, 7, running_http)),
               threading.Thread(target=_gated_grpc, args=(old.grpc_url, 8, running_grpc))]
    for thread in threads:
        thread.start()
    time.sleep(1.5)  # both now run, one in each instance of "gated"
    threads.append(threading.Thread(target=_gated_http, args=(old.url, 9, queued)))
    threads[-1].start()  # queued behind them
    time.sleep(0.3)

    os.kill(old.process.pid, signal.SIGKILL)
    old.process.wait(timeout=10)
    try:
        new = ShoalServer([str(small_repo)], ports=old.ports)
        fresh_server_factory.append(new)
        new.start(timeout=120)
        _check_while_the_old_children_drain(new, old_id, old_frontend)
        assert not running_http and not running_grpc, "the gated requests ended early"
        gate.touch()  # the old in-flight requests end: the running ones complete
        for thread in threads:
            thread.join(timeout=60)
        assert running_http.get("value") == 7, running_http
        assert running_grpc.get("value") == 8, running_grpc
        assert "value" in queued or "error" in queued, queued
        # afterwards nothing of the old server is left
        assert _wait_for(lambda: not any(p.is_running() for p in old_children), 60), \
            [p.pid for p in old_children if p.is_running()]
        assert _wait_for(lambda: not instance_files(old_id), 5), instance_files(old_id)
        assert not os.path.exists(os.path.join(tempfile.gettempdir(), f"shoal-{old_id}"))
    finally:
        gate.touch()
        for child in old_children:  # orphans: no fixture would stop them
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
    assert httpx.post(f"{new.base}/v2/models/add_sub/infer", json=_add_sub_body()).is_success
    assert new.stop() == 0


def _check_while_the_old_children_drain(new: ShoalServer, old_id: str, old_frontend: int) -> None:
    # their instance counts as live, nothing of it was swept
    assert psutil.pid_exists(old_frontend)
    assert instance_alive(old_id)
    old_files = instance_files(old_id)
    assert f"shoal-{old_id}.lock" in old_files
    assert any(f"-fe{old_frontend}-" in name for name in old_files), old_files
    # every new connection reaches the new server (the old one listens no more)
    for _ in range(10):
        with httpx.Client() as fresh:
            reply = fresh.post(f"{new.base}/v2/models/add_sub/infer", json=_add_sub_body())
            assert reply.status_code == 200, reply.text
    grpc = grpcclient.InferenceServerClient(new.grpc_url)
    assert grpc.is_server_ready()
    grpc.close()
    assert httpx.get(f"http://127.0.0.1:{new.metrics_port}/metrics").status_code == 200


_HOLD_PORT = """
import socket, sys, time
sock = socket.socket()
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen()
print("listening", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("which", ["HTTP", "gRPC", "metrics"])
def test_a_port_held_by_another_process_fails_the_start_naming_that_process(
    which: str, small_repo: pathlib.Path, fresh_server_factory: list[ShoalServer]
) -> None:
    port = free_port()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_PORT, str(port), "port-holder-e2e"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "listening"
        ports = {"HTTP": (port, free_port(), free_port()),
                 "metrics": (free_port(), port, free_port()),
                 "gRPC": (free_port(), free_port(), port)}[which]
        server = ShoalServer([str(small_repo)], ports=ports)
        fresh_server_factory.append(server)
        server.start(wait_ready=False)
        assert server.process is not None
        assert server.process.wait(timeout=30) != 0
        log = server.log()
        line = next((ln for ln in log.splitlines() if f"pid {holder.pid}" in ln), "")
        assert line, log
        assert f"for {which} on 127.0.0.1:{port}" in line
        assert "port-holder-e2e" in line  # the holder's command line
        assert re.search("address already in use", line)
    finally:
        holder.kill()
        holder.wait(timeout=10)
        if holder.stdout is not None:
            holder.stdout.close()
