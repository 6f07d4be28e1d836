"""A load / unload / reload storm on one model and on an ensemble's composing model while 32
clients infer for 12 s: no crash or deadlock, every request ends (answered or failed with an
error), and afterwards the server serves with exactly the configured workers and, once stopped,
leaves no process or /dev/shm segment behind (``serving``)."""

from __future__ import annotations

import os
import pathlib
import re
import threading
import time
from collections import Counter

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import serving
from tests.e2e.control_models import config_json, probe_config, probe_ensemble, probe_model
from tests.e2e.server import ShoalServer

STORM_SECONDS = 12.0
CLIENTS = 32

pytestmark = pytest.mark.slow


def _client_loop(url: str, model: str, stop: threading.Event, outcomes: Counter[str],
                 lock: threading.Lock) -> None:
    client = httpclient.InferenceServerClient(url, network_timeout=60)
    x = httpclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[0.002]], dtype=np.float32))
    try:
        while not stop.is_set():
            try:
                client.infer(model, [x])
                outcome = "ok"
            except InferenceServerException as exc:
                outcome = "error" if str(exc) else "empty error"
            with lock:
                outcomes[outcome] += 1
    finally:
        client.close()


def _controller(url: str, stop: threading.Event, actions: Counter[str]) -> None:
    client = httpclient.InferenceServerClient(url, network_timeout=120)
    step = 0
    while not stop.is_set():
        step += 1
        try:
            if step % 4 == 0:
                client.unload_model("first")
                client.load_model("first")
            elif step % 4 == 1:
                client.load_model("probe", config=config_json(
                    probe_config("probe", tag=step, count=1 + step % 2, max_batch_size=4)))
            elif step % 4 == 2:
                client.load_model("second")
            else:
                client.unload_model("probe")
                client.load_model("probe")
            actions["ok"] += 1
        except InferenceServerException as exc:
            actions[f"failed: {exc}"] += 1
    client.close()


def test_load_unload_reload_storm(tmp_path: pathlib.Path) -> None:
    probe_model(tmp_path, "probe", tag=1)
    probe_model(tmp_path, "first", tag=11)
    probe_model(tmp_path, "second", tag=22)
    probe_ensemble(tmp_path, "pipeline", "first", "second")
    args = ["--model-control-mode=explicit", "--load-model=probe", "--load-model=pipeline",
            "--exit-timeout-secs=5"]
    with serving(ShoalServer([str(tmp_path)], args)) as srv:
        stop = threading.Event()
        lock = threading.Lock()
        outcomes: Counter[str] = Counter()
        actions: Counter[str] = Counter()
        threads = [threading.Thread(target=_client_loop,
                                    args=(srv.url, "probe" if i % 2 else "pipeline", stop,
                                          outcomes, lock))
                   for i in range(CLIENTS)]
        threads.append(threading.Thread(target=_controller, args=(srv.url, stop, actions)))
        for t in threads:
            t.start()
        time.sleep(STORM_SECONDS)
        stop.set()
        for t in threads:
            t.join(timeout=90)
        assert not any(t.is_alive() for t in threads), "a client or the controller hung"
        assert actions["ok"] >= 4 and len(actions) == 1, actions
        assert outcomes["ok"] > 100 and "empty error" not in outcomes, outcomes

        client = httpclient.InferenceServerClient(srv.url)
        client.load_model("probe", config=config_json(probe_config("probe", tag=1, count=2)))
        client.load_model("first")
        client.load_model("second")
        assert client.is_server_ready()
        x = httpclient.InferInput("X", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[0.0]], dtype=np.float32))
        assert int(client.infer("pipeline", [x]).as_numpy("TAG")[0, 0]) == 22
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (len(srv.worker_pids("probe")) != 2
                                               or len(srv.worker_pids("first")) != 1):
            time.sleep(0.1)
        assert len(srv.worker_pids("probe")) == 2 and len(srv.worker_pids("first")) == 1
        client.close()
        _assert_only_live_workers_own_segments(srv)


def _assert_only_live_workers_own_segments(srv: ShoalServer) -> None:
    """Every worker segment (``shoal-<id>-w<serial>-...``) belongs to a worker still running:
    the workers of the generations that drained took their shared memory with them."""
    live_prefixes = set()
    for pid in srv.worker_pids():
        cmdline = " ".join(psutil.Process(pid).cmdline())
        match = re.search(r'"arena_prefix":"/(shoal-[0-9a-f]+-w\d+-)', cmdline)
        assert match, cmdline[:200]
        live_prefixes.add(match.group(1))
    (instance,) = {p.split("-")[1] for p in live_prefixes}  # this server's segments only
    deadline = time.monotonic() + 10
    while True:
        worker_segments = {n for n in os.listdir("/dev/shm")
                           if re.match(rf"shoal-{instance}-w\d+-", n)}
        stale = {n for n in worker_segments if not any(n.startswith(p) for p in live_prefixes)}
        if not stale or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not stale, sorted(stale)
