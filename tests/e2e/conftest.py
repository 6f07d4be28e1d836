"""End-to-end fixtures: real ``shoal serve`` process trees over model repositories built in tmp."""

from __future__ import annotations

import contextlib
import pathlib
import time
from collections.abc import Iterator

import pytest

from tests.conftest import orphan_segments, shoal_processes, shoal_segments
from tests.e2e.models import build_standard_repository
from tests.e2e.server import ShoalServer


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def standard_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return build_standard_repository(tmp_path_factory.mktemp("repo"))


def _assert_clean_after(
    server: ShoalServer, segments_before: set[str], procs_before: set[int]
) -> None:
    code = server.stop()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (
        orphan_segments(segments_before) or shoal_processes() - procs_before
    ):
        time.sleep(0.1)
    assert code == 0, f"shoal exited with {code}"
    assert not orphan_segments(segments_before), "server left segments in /dev/shm"
    assert not shoal_processes() - procs_before, "server left processes running"


@contextlib.contextmanager
def serving(srv: ShoalServer, timeout: float = 60.0) -> Iterator[ShoalServer]:
    """Start ``srv`` for the ``with`` block (ready within ``timeout`` s); at its end the server
    must stop with exit code 0 and leave no segment or process behind."""
    segments_before, procs_before = shoal_segments(), shoal_processes()
    try:
        srv.start(timeout=timeout)
    except BaseException:  # not ready in time (or a test timeout): stop it, do not orphan it
        srv.stop()
        raise
    try:
        yield srv
    finally:
        _assert_clean_after(srv, segments_before, procs_before)


@pytest.fixture(scope="session")
def server(standard_repo: pathlib.Path) -> Iterator[ShoalServer]:
    """One server over the standard repository, shared by every module that asks for it (in
    each pytest-xdist process; ``serving``). Its tests must leave it as they found it: read
    statistics as deltas, put changed log or trace settings back, kill no process of it."""
    with serving(ShoalServer([str(standard_repo)])) as srv:
        yield srv


@pytest.fixture(scope="session")
def shm_server(standard_repo: pathlib.Path) -> Iterator[ShoalServer]:
    """Like ``server``, with client shared memory allowed (--allow-client-shm); shared the same
    way, so its tests unregister the regions they register."""
    with serving(ShoalServer([str(standard_repo)], ["--allow-client-shm=true"])) as srv:
        yield srv


@pytest.fixture
def fresh_server_factory() -> Iterator[list[ShoalServer]]:
    """For tests that kill or stop their server: collects servers and cleans up whatever is left."""
    servers: list[ShoalServer] = []
    yield servers
    for srv in servers:
        if srv.process is not None and srv.process.poll() is None:
            try:
                srv.stop(timeout=30)
            except Exception:
                srv.kill_tree()
