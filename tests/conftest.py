"""Suite-wide guard: no test may leave a shoal shared-memory segment or a shoal process behind.

Every segment and child process of a server carries the server's instance id (segment names
``shoal-<id>-...``, the lock ``shoal-<id>.lock``, ``"instance_id":"<id>"`` in children's argv).
A test is charged with:
- new segments of instances whose server is gone (nobody holds the instance lock any more: a
  live server elsewhere on the machine, e.g. another checkout's test run, is not this test's);
- new shoal processes descended from this pytest process, of instances that appeared while it
  ran (a server the test started and did not stop).
Servers shared by a module are checked when the module ends (tests/e2e/conftest.py)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator

import posix_ipc
import psutil
import pytest

from shoal.shm.sweep import instance_alive

_SEGMENT = re.compile(r"^shoal-([0-9a-f]{12})[-.]")
# the supervisor's and broker's argv carry the settings JSON; a worker's carries them as a string
# inside its spec's JSON (escaped quotes)
_INSTANCE_ARG = re.compile(r'\\?"instance_id\\?":\\?"([0-9a-f]{12})')


def shoal_segments() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("shoal")}
    except FileNotFoundError:
        return set()


def _cmdlines() -> dict[int, str]:
    """Shoal processes descended from this test run."""
    found: dict[int, str] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "-m shoal" in cmdline or "bin/shoal serve" in cmdline:
            found[proc.pid] = cmdline
    return found


def _server_alive(instance_id: str | None) -> bool:
    return instance_id is not None and instance_alive(instance_id)


def orphan_segments(before: set[str]) -> set[str]:
    """Segments that appeared since ``before`` and whose server is no longer alive."""
    return {n for n in shoal_segments() - before if not _server_alive(_instance_of_segment(n))}


def shoal_processes() -> set[int]:
    return set(_cmdlines())


def _instance_of_segment(name: str) -> str | None:
    match = _SEGMENT.match(name)
    return match.group(1) if match else None


def instance_of_process(cmdline: str) -> str | None:
    match = _INSTANCE_ARG.search(cmdline)
    return match.group(1) if match else None


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    """Fails the test that leaves a shoal segment in /dev/shm or a shoal process running."""
    segments_before = shoal_segments()
    known = {_instance_of_segment(n) for n in segments_before} - {None}
    procs_before = shoal_processes()
    yield

    def leftovers() -> tuple[set[str], set[str]]:
        # a live server's segments are not leftovers: a server of this run still alive shows
        # up as a process below; one of another test run is none of this test's business
        segs = {
            n for n in orphan_segments(segments_before) if _instance_of_segment(n) not in known
        }
        procs = {
            f"{pid}: {cmd[:120]}"
            for pid, cmd in _cmdlines().items()
            if pid not in procs_before and instance_of_process(cmd) not in known
        }
        return segs, procs

    deadline = time.monotonic() + 5.0
    new_segments, new_procs = leftovers()
    while (new_segments or new_procs) and time.monotonic() < deadline:
        time.sleep(0.1)
        new_segments, new_procs = leftovers()
    assert not new_segments, f"test left shared-memory segments behind: {sorted(new_segments)}"
    assert not new_procs, f"test left shoal processes running: {sorted(new_procs)}"


@pytest.fixture
def shm_prefix() -> Iterator[str]:
    """A unique segment-name prefix ``/shoal-test-<random>-`` in the real /dev/shm. After the
    test, anything left under it is removed and the test fails: code under test must clean up."""
    prefix = f"/shoal-test-{secrets.token_hex(6)}-"
    yield prefix
    leftovers = sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix[1:]))
    for name in leftovers:
        os.unlink(os.path.join("/dev/shm", name))
    assert leftovers == [], f"shared memory leaked: {leftovers}"


MakeObject = Callable[[int], str]


@pytest.fixture
def make_object() -> Iterator[MakeObject]:
    """Creates client POSIX shm objects (mode 0600) of a given size and returns their keys
    (``/shmtest-<random>``: ``/shoal-`` keys are the server's and cannot be registered);
    unlinks them all afterwards and checks that none is left."""
    keys: list[str] = []

    def make(size: int) -> str:
        key = f"/shmtest-{secrets.token_hex(6)}"
        posix_ipc.SharedMemory(key, posix_ipc.O_CREX, mode=0o600, size=size).close_fd()
        keys.append(key)
        return key

    yield make
    for key in keys:
        with contextlib.suppress(posix_ipc.ExistentialError):
            posix_ipc.unlink_shared_memory(key)
    assert not [k for k in keys if os.path.exists("/dev/shm" + k)]


def _run_order(item: pytest.Item) -> int:
    """Files holding the suite's longest tests first: the slow tier, then the tiers that start
    real servers, then unit tests. pytest-xdist (``--dist loadfile``) hands whole files out in
    collection order as its processes free up, so a long file collected last would run alone
    at the end."""
    path = str(item.fspath).replace("\\", "/")
    if item.get_closest_marker("slow") is not None:
        return 0
    if any(f"/tests/{tier}/" in path for tier in ("e2e", "conformance", "fuzz", "deploy")):
        return 1
    return 2


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    file_order: dict[str, int] = {}
    for item in items:  # a file ranks as its most urgent test, so its tests stay together
        file_order[str(item.fspath)] = min(file_order.get(str(item.fspath), 2), _run_order(item))
    items.sort(key=lambda item: file_order[str(item.fspath)])  # stable: in-file order kept
