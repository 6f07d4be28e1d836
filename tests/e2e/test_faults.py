"""Faults and shutdown: a SIGKILLed worker, SIGTERM, a SIGKILLed server tree, /dev/shm too
small, models that fail to load."""

from __future__ import annotations

import os
import pathlib
import signal
import threading
import time

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import instance_of_process, orphan_segments, shoal_segments
from tests.e2e.models import copy_example, sleepy_model
from tests.e2e.server import ShoalServer


@pytest.fixture
def small_repo(tmp_path: pathlib.Path) -> pathlib.Path:
    copy_example(tmp_path, "add_sub")
    sleepy_model(tmp_path, "sleepy")
    return tmp_path


def _delay_input(delay: float) -> list[httpclient.InferInput]:
    inp = httpclient.InferInput("DELAY", [1], "FP32")
    inp.set_data_from_numpy(np.array([delay], np.float32))
    return [inp]


def _add_sub(client: httpclient.InferenceServerClient) -> np.ndarray:
    inputs = [
        httpclient.InferInput("INPUT0", [4], "FP32"),
        httpclient.InferInput("INPUT1", [4], "FP32"),
    ]
    for i in inputs:
        i.set_data_from_numpy(np.ones(4, np.float32))
    return client.infer("add_sub", inputs).as_numpy("OUTPUT0")


def _wait_for(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_killed_worker_fails_its_requests_fast_and_is_replaced(
    small_repo: pathlib.Path, fresh_server_factory: list[ShoalServer]
) -> None:
    server = ShoalServer([str(small_repo)]).start()
    fresh_server_factory.append(server)
    client = httpclient.InferenceServerClient(server.url, network_timeout=30)
    (pid,) = server.worker_pids("sleepy")
    outcome: dict[str, object] = {}

    def call() -> None:
        own = httpclient.InferenceServerClient(server.url, network_timeout=30)  # gevent: per thread
        try:
            own.infer("sleepy", _delay_input(20.0))
            outcome["error"] = None
        except InferenceServerException as exc:
            outcome["error"] = str(exc)
        outcome["at"] = time.monotonic()

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(1.0)  # the request is now executing inside the worker
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=10)
    assert outcome.get("error"), "the request held by the killed worker did not fail"
    assert float(outcome["at"]) - killed_at < 1.0  # type: ignore[arg-type]
    assert "sleepy_0_0" in str(outcome["error"])
    # other models keep serving while the instance is replaced
    np.testing.assert_array_equal(_add_sub(client), np.full(4, 2, np.float32))
    assert _wait_for(
        lambda: client.is_model_ready("sleepy") and server.worker_pids("sleepy") not in ([], [pid]),
        30,
    )
    result = client.infer("sleepy", _delay_input(0.0))
    assert int(result.as_numpy("PID")[0]) != pid


def test_a_request_right_after_an_idle_worker_was_killed_is_served_by_its_replacement(
    small_repo: pathlib.Path, fresh_server_factory: list[ShoalServer]
) -> None:
    """Triton 2.51 fails the first request after its stub died ("Stub process ... is not
    healthy", which Triton's L0_backend_python/restart expects); shoal's broker sees the death
    on the process's pidfd, starts the replacement and queues what comes meanwhile for it
    (docs/triton-differences.md). The request is sent once the broker has seen the death (the
    replacement's process exists, whether or not it has loaded yet): before that, in the
    moment between a kill and the broker's next poll, a request can still reach the dying
    worker and fail with it."""
    server = ShoalServer([str(small_repo)]).start()
    fresh_server_factory.append(server)
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    (pid,) = server.worker_pids("sleepy")
    os.kill(pid, signal.SIGKILL)
    assert _wait_for(lambda: server.worker_pids("sleepy") not in ([], [pid]), 10)
    result = client.infer("sleepy", _delay_input(0.0))
    assert int(result.as_numpy("PID")[0]) != pid


def test_model_not_ready_until_replacement_loaded(
    small_repo: pathlib.Path, fresh_server_factory: list[ShoalServer]
) -> None:
    server = ShoalServer([str(small_repo)]).start()
    fresh_server_factory.append(server)
    client = httpclient.InferenceServerClient(server.url)
    (pid,) = server.worker_pids("sleepy")
    # a replacement that takes a while to load makes the window observable
    os.kill(pid, signal.SIGKILL)
    assert _wait_for(lambda: not client.is_model_ready("sleepy"), 5) or (
        client.is_model_ready("sleepy") and server.worker_pids("sleepy") != [pid]
    )
    assert _wait_for(lambda: client.is_model_ready("sleepy"), 30)
    assert client.is_model_ready("add_sub")


def test_sigterm_drains_in_flight_then_exits_clean(
    small_repo: pathlib.Path, fresh_server_factory: list[ShoalServer]
) -> None:
    segments_before = shoal_segments()
    server = ShoalServer([str(small_repo)]).start()
    fresh_server_factory.append(server)
    httpclient.InferenceServerClient(server.url, network_timeout=30)
    outcome: dict[str, object] = {}

    def call() -> None:
        own = httpclient.InferenceServerClient(server.url, network_timeout=30)  # gevent: per thread
        try:
            outcome["value"] = float(
                own.infer("sleepy", _delay_input(2.0)).as_numpy("DELAY_OUT")[0]
            )
        except Exception as exc:  # recorded, asserted below
            outcome["error"] = repr(exc)

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.7)
    assert server.process is not None
    server.process.send_signal(signal.SIGTERM)
    assert _wait_for(lambda: httpx.get(server.base + "/v2/health/live").status_code == 503, 2)
    assert httpx.get(server.base + "/v2/health/ready").status_code == 503
    r = httpx.post(
        server.base + "/v2/models/add_sub/infer",
        json={
            "inputs": [
                {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            ]
        },
    )
    assert r.status_code == 503
    thread.join(timeout=15)
    assert outcome.get("value") == 2.0, outcome
    assert server.process.wait(timeout=30) == 0
    assert "add_sub: finalize" in server.log()
    assert _wait_for(lambda: not orphan_segments(segments_before), 5)


def test_next_start_removes_segments_of_a_killed_server(
    small_repo: pathlib.Path, fresh_server_factory: list[ShoalServer]
) -> None:
    before = shoal_segments()
    first = ShoalServer([str(small_repo)]).start()
    fresh_server_factory.append(first)
    _add_sub(httpclient.InferenceServerClient(first.url))  # creates frontend + worker segments
    # only this server's segments: another test's server may still be leaving at the same time
    first_id = instance_of_process(" ".join(first.children()[0].cmdline()))
    left = {n for n in shoal_segments() - before if n.startswith(f"shoal-{first_id}")}
    assert left, "a serving server owns segments"
    first.kill_tree()
    assert left <= shoal_segments(), "SIGKILL leaves the dead server's segments"
    second = ShoalServer([str(small_repo)]).start()
    fresh_server_factory.append(second)
    assert not (left & shoal_segments()), "the next start removed them"
    assert second.stop() == 0


def test_dev_shm_too_small_is_explained(
    small_repo: pathlib.Path, fresh_server_factory: list[ShoalServer]
) -> None:
    server = ShoalServer([str(small_repo)], ["--shm-segment-byte-size=" + str(2**50)])
    fresh_server_factory.append(server)
    server.start(wait_ready=False)
    assert server.process is not None
    assert server.process.wait(timeout=30) != 0
    log = server.log()
    assert "/dev/shm" in log and "--shm-size" in log


def test_failed_model_load_exits_by_default(
    tmp_path: pathlib.Path, fresh_server_factory: list[ShoalServer]
) -> None:
    copy_example(tmp_path, "add_sub")
    broken = tmp_path / "broken" / "1"
    broken.mkdir(parents=True)
    (tmp_path / "broken" / "config.pbtxt").write_text(
        'name: "broken"\nbackend: "python"\n'
        'input [{ name: "X" data_type: TYPE_FP32 '
        'dims: [1] }]\noutput [{ name: "Y" '
        "data_type: TYPE_FP32 dims: [1] }]\n"
    )
    (broken / "model.py").write_text("raise RuntimeError('cannot import this model')\n")
    server = ShoalServer([str(tmp_path)])
    fresh_server_factory.append(server)
    server.start(wait_ready=False)
    assert server.process is not None
    assert server.process.wait(timeout=60) == 1
    assert "failed to load" in server.log() and "cannot import this model" in server.log()

    bad_config = tmp_path / "bad_config"
    (bad_config / "1").mkdir(parents=True)
    (bad_config / "config.pbtxt").write_text('name: "bad_config"\nbackend: "python"\n'
                                              'input [{ name: "X" data_type: TYPE_FP32 }]\n')
    tolerant = ShoalServer([str(tmp_path)], ["--exit-on-error=false"])
    fresh_server_factory.append(tolerant)
    tolerant.start(wait_ready=False)
    client = httpclient.InferenceServerClient(tolerant.url)
    assert _wait_for(lambda: _live(client) and client.is_model_ready("add_sub"), 60)

    def index() -> dict[str, dict[str, str]]:
        return {m["name"]: m for m in client.get_model_repository_index()}

    assert _wait_for(lambda: index()["broken"]["state"] == "UNAVAILABLE", 30)
    assert not client.is_server_ready()  # strict readiness: one model is not ready
    assert "cannot import this model" in index()["broken"].get("reason", "")
    assert index()["bad_config"]["state"] == "UNAVAILABLE"
    assert "bad_config/config.pbtxt" in index()["bad_config"]["reason"]
    assert "dims" in index()["bad_config"]["reason"]
    assert tolerant.stop() == 0


def _live(client: httpclient.InferenceServerClient) -> bool:
    try:
        return bool(client.is_server_live())
    except Exception:
        return False


def test_two_http_workers_share_the_port_and_stop_clean(
    small_repo: pathlib.Path, fresh_server_factory: list[ShoalServer]
) -> None:
    segments_before = shoal_segments()
    server = ShoalServer([str(small_repo)], ["--http-workers=2"]).start()
    fresh_server_factory.append(server)
    frontends = [c for c in server.children() if "shoal.frontend" in " ".join(c.cmdline())]
    assert len(frontends) == 2
    for _ in range(20):  # a new connection each time: the kernel spreads them over both
        with httpx.Client() as fresh:
            r = fresh.post(server.base + "/v2/models/add_sub/infer", json={"inputs": [
                {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
            assert r.status_code == 200
    assert server.stop() == 0
    assert _wait_for(lambda: not orphan_segments(segments_before), 5)
