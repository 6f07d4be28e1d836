"""Every process of an instance holds its lock (workers/lifecycle.hold_instance_lock); the last one
out removes the instance's segments, runtime dir and lock file. Real /dev/shm, fresh ids."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from shoal.process.lifecycle import hold_instance_lock, leave_instance
from shoal.settings import Settings, settings_from_flags
from shoal.shm.sweep import InstanceLock, instance_alive, new_instance_id

_MEMBER = """
import os, sys
from shoal.settings import Settings
from shoal.process.lifecycle import hold_instance_lock
settings = Settings.from_json(sys.argv[1])
hold_instance_lock(settings)
open("/dev/shm" + settings.instance.segment_prefix + "member-0", "wb").close()  # its own segment
print("member", flush=True)
sys.stdin.read()  # until the test closes stdin; then a normal exit (atexit leaves the lock)
"""


def _settings(tmp_path: pathlib.Path) -> Settings:
    runtime_dir = tmp_path / "runtime"
    runtime_dir.mkdir()
    return settings_from_flags(model_repositories=["/m"], instance_id=new_instance_id(),
                               runtime_dir=str(runtime_dir))


def _files(settings: Settings) -> list[str]:
    prefix = f"shoal-{settings.instance.instance_id}"
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


def test_the_last_process_out_removes_the_instance(tmp_path: pathlib.Path) -> None:
    settings = _settings(tmp_path)
    creator = InstanceLock(settings.instance.instance_id)
    member = subprocess.Popen([sys.executable, "-c", _MEMBER, settings.to_json().decode()],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert member.stdout is not None and member.stdout.readline().strip() == "member"
        # the creator (a supervisor SIGKILLed would be the same) goes first: the member lives on
        assert not leave_instance(creator, settings)
        assert instance_alive(settings.instance.instance_id)
        assert _files(settings) == sorted([f"shoal-{settings.instance.instance_id}-member-0",
                                           f"shoal-{settings.instance.instance_id}.lock"])
        assert member.stdin is not None
        member.stdin.close()
        assert member.wait(timeout=30) == 0
        assert _files(settings) == []  # the member was the last one out
        assert not os.path.exists(settings.instance.runtime_dir)
    finally:
        if member.poll() is None:
            member.kill()
            member.wait()
        if member.stdout is not None:
            member.stdout.close()
        for name in _files(settings):
            os.unlink("/dev/shm/" + name)


def test_a_process_of_a_gone_instance_refuses_to_start(tmp_path: pathlib.Path) -> None:
    settings = _settings(tmp_path)
    with pytest.raises(SystemExit, match="is gone"):
        hold_instance_lock(settings)


def test_no_instance_id_no_lock() -> None:
    hold_instance_lock(Settings())  # in-process tests: nothing to join
