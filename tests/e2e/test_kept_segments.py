"""Dedicated segments kept for reuse (``shm/arena.py``) on a real server: a tensor larger than
``--shm-segment-byte-size`` gets a segment of its own in the frontend (the body) and in the
worker (the output); once freed, each is kept and the next request of about the same size
reuses it, byte-exact. Nothing is left behind: a killed worker's and a killed frontend's kept
segments are removed by the broker and the supervisor, and the server's stop removes the rest
(``serving`` checks /dev/shm after the stop)."""

from __future__ import annotations

import os
import pathlib
import signal
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import instance_of_process, shoal_segments
from tests.e2e.conftest import serving
from tests.e2e.models import identity_all_model
from tests.e2e.server import ShoalServer

SEGMENT = 1 << 20  # 1 MiB regular segments: a 4 MB tensor gets a dedicated one


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo: pathlib.Path = tmp_path_factory.mktemp("kept_repo")
    identity_all_model(repo)
    with serving(ShoalServer([str(repo)], [f"--shm-segment-byte-size={SEGMENT}"])) as srv:
        yield srv


def _infer(server: ShoalServer, array: np.ndarray) -> np.ndarray:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}",
                                              network_timeout=120)
    try:
        tensor = httpclient.InferInput("IN_FP32", list(array.shape), "FP32")
        tensor.set_data_from_numpy(array, binary_data=True)
        result = client.infer("identity_all", [tensor], outputs=[
            httpclient.InferRequestedOutput("OUT_FP32", binary_data=True)])
        got = result.as_numpy("OUT_FP32")
        assert got is not None
        return got
    finally:
        client.close()


def _segments(server: ShoalServer, part: str) -> set[str]:
    """This server's segments whose name continues its prefix with ``part`` ("fe", "w")."""
    instance = instance_of_process(" ".join(server.children()[0].cmdline()))
    assert instance is not None
    return {n for n in shoal_segments() if n.startswith(f"shoal-{instance}-{part}")}


def _wait_for(condition: Callable[[], bool], seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def _array(seed: int, count: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(count, dtype=np.float32)


def test_large_requests_reuse_kept_segments_byte_exact(server: ShoalServer) -> None:
    first = _array(1, 1 << 20)  # 4 MB
    np.testing.assert_array_equal(_infer(server, first), first)
    frontend, worker = _segments(server, "fe"), _segments(server, "w")
    assert frontend and worker
    # new data of the same size, then a little smaller (within the kept segment's slack):
    # the same segments serve them, and no byte of an earlier tensor shows through
    for seed, count in ((2, 1 << 20), (3, (1 << 20) - 4096), (4, 1 << 20)):
        array = _array(seed, count)
        np.testing.assert_array_equal(_infer(server, array), array)
    assert _segments(server, "fe") == frontend
    assert _segments(server, "w") == worker


def test_a_killed_workers_kept_segments_are_removed(server: ShoalServer) -> None:
    array = _array(5, 1 << 20)
    np.testing.assert_array_equal(_infer(server, array), array)
    (pid,) = server.worker_pids("identity_all")
    worker = _segments(server, "w")
    assert worker
    os.kill(pid, signal.SIGKILL)
    assert _wait_for(lambda: not worker & _segments(server, "w")), \
        "the dead worker's segments are left"
    assert _wait_for(lambda: len(server.worker_pids("identity_all")) == 1
                     and server.worker_pids("identity_all") != [pid], 60)
    assert _wait_for(lambda: _try_infer(server, array), 60), "the replaced worker does not serve"


def test_a_killed_frontends_kept_segments_are_removed(server: ShoalServer) -> None:
    array = _array(6, 1 << 20)
    np.testing.assert_array_equal(_infer(server, array), array)
    (pid,) = server.frontend_pids()
    kept = _segments(server, f"fe{pid}-")
    assert kept
    os.kill(pid, signal.SIGKILL)
    assert _wait_for(lambda: not kept & shoal_segments()), "the dead frontend's segments are left"
    assert _wait_for(lambda: _try_infer(server, array), 60), "the restarted frontend does not serve"


def _try_infer(server: ShoalServer, array: np.ndarray) -> bool:
    try:
        return bool(np.array_equal(_infer(server, array), array))
    except Exception:
        return False


def test_the_next_start_sweeps_the_kept_segments_of_a_killed_server(
        tmp_path: pathlib.Path, fresh_server_factory: list[ShoalServer]) -> None:
    identity_all_model(tmp_path)
    args = [f"--shm-segment-byte-size={SEGMENT}"]
    first = ShoalServer([str(tmp_path)], args).start()
    fresh_server_factory.append(first)
    array = _array(7, 1 << 20)
    np.testing.assert_array_equal(_infer(first, array), array)
    kept = {n for n in _segments(first, "") if os.stat("/dev/shm/" + n).st_size > SEGMENT}
    assert any("-fe" in n for n in kept) and any("-w" in n for n in kept), kept
    first.kill_tree()
    if not kept <= shoal_segments():  # /dev/shm is the machine's: any server start sweeps
        pytest.skip("another server's start swept the dead server's segments first")
    second = ShoalServer([str(tmp_path)], args).start()
    fresh_server_factory.append(second)
    assert not kept & shoal_segments(), "the next start's sweep removed them"
    assert second.stop() == 0
