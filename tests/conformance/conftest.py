"""The real tritonserver beside shoal, over one repository, for a module's differential tests.

Both servers start together (each takes ~10 s) and stop after the module; the module's tests
send them the same requests in the same order. Where tritonserver cannot run here the tests
skip with the reason (tests/conformance/tritonserver.py). Shoal must stop cleanly: exit code 0,
no segment and no process left (as ``tests.e2e.conftest.serving`` asserts)."""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
from collections.abc import Iterator, Sequence

import pytest

from tests.conformance.repository import build_repository
from tests.conformance.tritonserver import RealTriton, unavailable_reason
from tests.conftest import orphan_segments, shoal_processes, shoal_segments
from tests.e2e.server import ShoalServer


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/conformance/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.e2e)


@dataclasses.dataclass(frozen=True)
class Pair:
    triton: RealTriton
    shoal: ShoalServer


@contextlib.contextmanager
def serving_pair(repo: pathlib.Path, shoal_args: Sequence[str] = (),
                 triton_args: Sequence[str] = ()) -> Iterator[Pair]:
    """Both servers over ``repo`` (skips where tritonserver cannot run). Client shared memory
    is off by default in shoal (deliberately): the shm cases need it, so it is on."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    segments_before, procs_before = shoal_segments(), shoal_processes()
    shoal = ShoalServer([str(repo)], ["--allow-client-shm=true", *shoal_args])
    triton = RealTriton([str(repo)], triton_args)
    try:
        shoal.start(wait_ready=False)  # both load their models at the same time
        triton.start()
        shoal.wait_ready(60)
        yield Pair(triton, shoal)
    finally:
        triton.stop()
        code = shoal.stop()
    assert code == 0, f"shoal exited with {code}"
    assert not orphan_segments(segments_before), "shoal left segments in /dev/shm"
    assert not shoal_processes() - procs_before, "shoal left processes running"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    with serving_pair(build_repository(tmp_path_factory.mktemp("conformance") / "repo")) as p:
        yield p
