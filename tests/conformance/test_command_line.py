"""Every flag the real ``tritonserver`` 2.51 lists in its ``--help`` is a flag ``shoal serve``
takes, so a Triton command line (a systemd unit, a Helm chart) starts shoal unchanged
(``shoal/frontend/triton_flags.py`` says what each one does here). Skips where tritonserver
cannot run."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re
import subprocess

import pytest

from bench import tritonserver
from shoal.server.cli import build_parser
from tests.conformance.tritonserver import unavailable_reason


def _triton_flags(workdir: pathlib.Path) -> list[str]:
    argv, env = tritonserver.command([], workdir, 1, 2, 3)
    shown = subprocess.run([argv[0], "--help"], env=env, capture_output=True, text=True,
                           timeout=60)
    return sorted(set(re.findall(r"^\s+(--[a-z0-9-]+)", shown.stdout + shown.stderr, re.M)))


def _shoal_flags() -> set[str]:
    """The flags ``shoal serve --help`` lists."""
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    return set(re.findall(r"(--[a-z0-9-]+)", shown.getvalue()))


def test_shoal_serve_takes_every_tritonserver_flag(tmp_path: pathlib.Path) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    theirs = _triton_flags(tmp_path)
    assert len(theirs) > 50, f"tritonserver --help listed only {theirs}"
    missing = [flag for flag in theirs if flag not in _shoal_flags()]
    assert not missing, f"tritonserver flags shoal serve refuses: {missing}"
