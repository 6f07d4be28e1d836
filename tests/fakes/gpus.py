"""Fake GPUs for the test suite, declared to the server through its ``SHOAL_DEVICE_INVENTORY``
hook (``shoal.process.devices.declared_gpus``): ``SHOAL_FAKE_GPUS="0:2GiB,1:2GiB"`` lists GPUs
0..N-1 and their memory sizes, and ``inventory`` (the provider, ``PROVIDER``) turns it into
{id: bytes}. The server then sees exactly those GPUs and runs their KIND_GPU instances on the CPU,
so device-memory admission is driven end to end through real processes on a CPU-only machine.

``fake_gpus_env(spec)`` is the environment a server subprocess needs for it, its workers
included (they import this module too, hence the repository root on PYTHONPATH)."""

from __future__ import annotations

import os
import pathlib
from typing import Final

from shoal.errors import ShoalError, invalid_arg
from shoal.process.devices import DEVICE_INVENTORY_ENV, parse_byte_size

FAKE_GPUS_ENV: Final = "SHOAL_FAKE_GPUS"
PROVIDER: Final = "tests.fakes.gpus:inventory"
REPO_ROOT: Final = pathlib.Path(__file__).resolve().parents[2]
_FORM: Final = "'<id>:<size>,...' with ids 0..N-1, e.g. '0:2GiB,1:2GiB'"


def inventory() -> dict[int, int]:
    """The GPUs SHOAL_FAKE_GPUS lists, {id: bytes}; sizes as ``parse_byte_size`` reads them.
    INVALID_ARG naming the variable when it is unset, empty or malformed (an entry that is not
    "<id>:<size>", a negative or repeated id, a size of 0, ids that are not 0..N-1)."""
    value = os.environ.get(FAKE_GPUS_ENV, "").strip()
    if not value:
        raise _error(value, "unset or empty")
    gpus: dict[int, int] = {}
    for entry in value.split(","):
        device, sep, size = entry.partition(":")
        try:
            device_id, nbytes = int(device), parse_byte_size(size)
        except ValueError:
            device_id, nbytes = -1, 0
        if not sep or device_id < 0 or nbytes <= 0 or device_id in gpus:
            raise _error(value, f"bad entry '{entry.strip()}'")
        gpus[device_id] = nbytes
    if sorted(gpus) != list(range(len(gpus))):
        raise _error(value, f"ids {sorted(gpus)} are not 0..{len(gpus) - 1}")
    return gpus


def fake_gpus_env(spec: str) -> dict[str, str]:
    """What to add to a server's environment for the fake GPUs ``spec`` ("0:2GiB,1:2GiB"): the
    hook naming ``inventory``, the spec, and PYTHONPATH with the repository root first (any
    PYTHONPATH already set follows), so the server and its workers import this module."""
    path = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {DEVICE_INVENTORY_ENV: PROVIDER, FAKE_GPUS_ENV: spec, "PYTHONPATH": path}


def _error(value: str, problem: str) -> ShoalError:
    return invalid_arg(f"{FAKE_GPUS_ENV} (test-only) must be {_FORM}; got '{value}': {problem}")
