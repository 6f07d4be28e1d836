"""A server running as its own user (a systemd service's `shoal`) starts beside another user's
shoal files in /dev/shm: the sweep leaves files it may not open alone instead of failing the
start with PermissionError."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

_SWEEP_AS_NOBODY = """
import os, sys
from shoal.shm.sweep import sweep_stale_segments  # imported as root: the stdlib may be private
os.setgid(65534)
os.setuid(65534)
print(sweep_stale_segments(sys.argv[1]))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the sweep as another user")
def test_another_users_files_are_left_alone() -> None:
    shm_dir = pathlib.Path(tempfile.mkdtemp(prefix="shoal-sweep-"))  # pytest's tmp is root-only
    shm_dir.chmod(0o1777)
    try:
        _check_sweep_as_nobody(shm_dir)
    finally:
        shutil.rmtree(shm_dir)


def _check_sweep_as_nobody(shm_dir: pathlib.Path) -> None:
    for name in ("shoal-0123456789ab.lock", "shoal-0123456789ab-w1-0"):
        (shm_dir / name).write_bytes(b"")
        (shm_dir / name).chmod(0o600)  # root's, like a root server's files
    result = subprocess.run([sys.executable, "-c", _SWEEP_AS_NOBODY, str(shm_dir)],
                            capture_output=True, text=True, timeout=60,
                            cwd=pathlib.Path(__file__).parents[2])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    assert sorted(os.listdir(shm_dir)) == ["shoal-0123456789ab-w1-0",
                                           "shoal-0123456789ab.lock"]
