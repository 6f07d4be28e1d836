"""The supervisor's watch over its frontends (stand-in processes, no real children)."""

from __future__ import annotations

import subprocess
from typing import cast

import pytest

from shoal.server import supervisor as supervision
from shoal.server.restarts import MAX_QUICK_DEATHS
from shoal.server.supervisor import FrontendSlot, Supervisor
from shoal.settings import settings_from_flags


class FakeProcess:
    next_pid = 100

    def __init__(self) -> None:
        FakeProcess.next_pid += 1
        self.pid = FakeProcess.next_pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


class FakeSupervisor(Supervisor):
    def __init__(self) -> None:
        super().__init__(settings_from_flags(model_repositories=["/m"], instance_id="0123456789ab",
                                             http_workers=2))
        self.status.close()
        self.spawned: list[int] = []
        self.frontends = [FrontendSlot(i, self.spawn_frontend(i), 0.0) for i in range(2)]
        self.spawned.clear()

    def spawn_frontend(self, index: int) -> subprocess.Popen[bytes]:
        self.spawned.append(index)
        return cast(subprocess.Popen[bytes], FakeProcess())


@pytest.fixture
def removed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    prefixes: list[str] = []
    monkeypatch.setattr(supervision, "remove_segments_with_prefix", prefixes.append)
    return prefixes


def _kill(slot: FrontendSlot, code: int) -> None:
    cast(FakeProcess, slot.process).returncode = code


def test_a_dead_frontend_is_restarted_in_place(removed: list[str]) -> None:
    supervisor = FakeSupervisor()
    dead = supervisor.frontends[1].process
    _kill(supervisor.frontends[1], -9)
    assert supervisor.watch_frontends(1.0)
    assert removed == [f"/shoal-0123456789ab-fe{dead.pid}-"]  # its input arena
    assert supervisor.spawned == []
    assert supervisor.watch_frontends(1.0)  # the first back-off is 0 s
    assert supervisor.spawned == [1]
    assert supervisor.frontends[1].process is not dead
    assert supervisor.frontends[0].process.poll() is None


def test_quick_deaths_in_a_row_give_up(removed: list[str]) -> None:
    supervisor = FakeSupervisor()
    now = 0.0
    for _ in range(MAX_QUICK_DEATHS - 1):
        _kill(supervisor.frontends[0], 1)
        assert supervisor.watch_frontends(now)
        now += 5.0
        assert supervisor.watch_frontends(now)  # restarted after its back-off
    assert supervisor.spawned == [0] * (MAX_QUICK_DEATHS - 1)
    _kill(supervisor.frontends[0], 1)
    assert not supervisor.watch_frontends(now)
    assert len(removed) == MAX_QUICK_DEATHS
