"""Which device a model instance runs on.

``resolve_device`` turns an instance group's kind and device id into the torch device string a
backend loads onto ("cpu", "cuda:N", "npu:N"); it runs inside the worker and may import torch.
``visible_gpu_count`` is for the supervisor/broker, which must not import torch: it counts the
NVIDIA driver's /proc entries and applies CUDA_VISIBLE_DEVICES the way the CUDA runtime does;
on a host without NVIDIA GPUs where ``torch_npu`` is installed it asks the Ascend runtime
(``torch.npu.device_count()``, which applies ASCEND_RT_VISIBLE_DEVICES) in a short-lived child
interpreter (``npu_count``), so KIND_GPU instances are placed on Ascend NPUs 0..N-1 and the
worker maps each to "npu:<id>". Only the mapping is tested (with a stand-in ``torch_npu``
package that reports a device count); nothing here has run on Ascend hardware.

Declared devices: ``SHOAL_DEVICE_INVENTORY="package.module:name"`` in the server's environment
names a callable taking no arguments that returns ``dict[int, int]``, GPU id -> bytes of memory,
with ids 0..N-1 (``declared_gpus``). When set, the server uses exactly those GPUs:
``visible_gpu_count`` returns N (CUDA_VISIBLE_DEVICES and the driver are ignored), the broker's
device-memory ledger uses the sizes as capacities, and ``resolve_device`` places a KIND_GPU /
KIND_MODEL instance of a declared id on "cpu". The hook exists so a CPU-only machine can drive
device admission end to end through real processes; the stand-in the test suite declares lives
in ``tests/fakes/gpus.py``. The callable is imported and called in every process that asks (the
broker and each worker), so its module must be importable there (PYTHONPATH) and it must give
the same answer each time. A malformed value, an import failure, a provider that raises, or a
result of the wrong shape is INVALID_ARG naming the variable. Unset (or empty), nothing changes.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import math
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from fractions import Fraction
from typing import Final

from shoal.errors import ErrorCode, ShoalError, invalid_arg

logger = logging.getLogger(__name__)

NVIDIA_PROC_GPUS = "/proc/driver/nvidia/gpus"
# Run in a child interpreter: the broker never imports torch. Prints the NPU count.
_NPU_COUNT_SCRIPT: Final = ("import torch, torch_npu\n"
                            "print(torch.npu.device_count() if torch.npu.is_available() else 0)")
_NPU_COUNT_TIMEOUT_S: Final = 120.0
DEVICE_INVENTORY_ENV: Final = "SHOAL_DEVICE_INVENTORY"
_INVENTORY_FORM: Final = ("'<package.module>:<name>', naming a callable that takes no arguments "
                          "and returns {gpu id: memory bytes} with ids 0..N-1")
_BYTE_SIZE: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", re.IGNORECASE)
_BYTE_UNITS: Final = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
    "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}


def parse_byte_size(text: str) -> int:
    """"1073741824", "512MiB", "1.5GiB", "2G" (binary), "2GB" (decimal) -> bytes, rounded up;
    units are case-insensitive. ValueError for anything else (negative, empty, unknown unit)."""
    match = _BYTE_SIZE.fullmatch(text)
    unit = _BYTE_UNITS.get(match.group(2).lower()) if match else None
    if match is None or unit is None:
        raise ValueError(f"'{text}' is not a byte size (e.g. 1073741824, 512MiB, 2GiB)")
    return math.ceil(Fraction(match.group(1)) * unit)


def declared_gpus(environ: Mapping[str, str] | None = None) -> dict[int, int] | None:
    """The GPUs SHOAL_DEVICE_INVENTORY declares (see the module docstring): {id: bytes} with ids
    0..N-1 and positive sizes (N may be 0: no GPUs), or None when the variable is unset or
    empty. Only the variable is read from ``environ``; the provider reads what it needs itself.
    INVALID_ARG naming the variable when the value is not "<module>:<name>", the module does
    not import, the name is not a callable, the call raises, or the result has the wrong shape
    (a ShoalError the provider raises keeps its message, prefixed)."""
    value = (os.environ if environ is None else environ).get(DEVICE_INVENTORY_ENV, "").strip()
    if not value:
        return None
    module_name, sep, attribute = (part.strip() for part in value.partition(":"))
    if not sep or not module_name or not attribute.isidentifier():
        raise _inventory_error(value, "not '<package.module>:<name>'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any failure to import (ImportError, SyntaxError, ...)
        raise _inventory_error(value, f"cannot import '{module_name}': "
                                      f"{type(exc).__name__}: {exc}") from exc
    provider = getattr(module, attribute, None)
    if not callable(provider):
        raise _inventory_error(value, f"'{module_name}' has no callable '{attribute}'")
    try:
        result = provider()
    except ShoalError as exc:
        raise _inventory_error(value, f"the provider failed: {exc.message}") from exc
    except Exception as exc:
        raise _inventory_error(value, f"the provider failed: "
                                      f"{type(exc).__name__}: {exc}") from exc
    return _checked_inventory(value, result)


def _checked_inventory(value: str, result: object) -> dict[int, int]:
    """``result`` as {id: bytes} when it is a dict of int ids 0..N-1 to positive int sizes."""
    if not isinstance(result, dict):
        raise _inventory_error(value, f"the provider returned a {type(result).__name__}, "
                                      f"not a dict")
    for device, size in result.items():
        if type(device) is not int or type(size) is not int or size <= 0:  # bool is no int here
            raise _inventory_error(value, f"bad entry {device!r}: {size!r} (an int id to a "
                                          f"positive int number of bytes)")
    if sorted(result) != list(range(len(result))):
        raise _inventory_error(value, f"ids {sorted(result)} are not 0..{len(result) - 1}")
    return {device: result[device] for device in sorted(result)}


def _inventory_error(value: str, problem: str) -> ShoalError:
    return invalid_arg(f"{DEVICE_INVENTORY_ENV} must be {_INVENTORY_FORM}; got '{value}': "
                       f"{problem}")


def resolve_device(kind: str, device_id: int, environ: Mapping[str, str] | None = None) -> str:
    """"CPU" -> "cpu"; "GPU" -> "cuda:<id>" or "npu:<id>"; "MODEL" -> the accelerator when one is
    visible, else "cpu" (the model places itself). Accepts "KIND_"-prefixed names too. Under
    SHOAL_DEVICE_INVENTORY (declared devices), a declared GPU id and MODEL -> "cpu"; an
    undeclared GPU id is the usual INVALID_ARG."""
    name = kind.upper().removeprefix("KIND_")
    if name == "CPU":
        return "cpu"
    if name not in ("GPU", "MODEL"):
        raise invalid_arg(f"unknown instance group kind '{kind}'")
    if device_id < 0:
        raise invalid_arg(f"instance group device id must be >= 0, got {device_id}")
    declared = declared_gpus(environ)
    if declared is not None:
        if name == "GPU" and device_id not in declared:
            raise invalid_arg(f"instance group asks for GPU device {device_id}, but only "
                              f"{len(declared)} device(s) are visible ({DEVICE_INVENTORY_ENV})")
        return "cpu"
    device = _accelerator(device_id)
    if device is not None:
        return device
    if name == "MODEL":
        return "cpu"
    raise ShoalError(
        ErrorCode.INVALID_ARG,
        "instance group kind KIND_GPU needs a CUDA or Ascend NPU device, but none is visible "
        "to torch; use KIND_CPU or make a device visible (CUDA_VISIBLE_DEVICES / "
        "ASCEND_RT_VISIBLE_DEVICES, docker --gpus)")


def _accelerator(device_id: int) -> str | None:
    """"cuda:<id>" / "npu:<id>" when that device exists; None when no accelerator is visible;
    INVALID_ARG when accelerators exist but ``device_id`` is not one of them."""
    import torch

    if torch.cuda.is_available():
        return _checked("cuda", device_id, torch.cuda.device_count())
    try:
        import torch_npu  # type: ignore[import-not-found]  # noqa: F401  (registers torch.npu)
    except ImportError:
        return None
    npu = getattr(torch, "npu", None)
    if npu is None or not npu.is_available():
        return None
    return _checked("npu", device_id, int(npu.device_count()))


def _checked(prefix: str, device_id: int, count: int) -> str:
    if device_id >= count:
        raise invalid_arg(f"instance group asks for {prefix} device {device_id}, but only "
                          f"{count} {prefix} device(s) are visible")
    return f"{prefix}:{device_id}"


def visible_gpu_count(proc_dir: str = NVIDIA_PROC_GPUS,
                      environ: Mapping[str, str] | None = None) -> int:
    """NVIDIA GPUs this process could use, without importing torch or CUDA.

    Counts the driver's entries under ``proc_dir`` (0 when the driver is absent) and applies
    CUDA_VISIBLE_DEVICES: an empty value hides every device; the list is read up to its first
    invalid entry (as the CUDA runtime does); UUID / MIG entries count as one device each.
    Without NVIDIA GPUs: the Ascend NPUs the installed runtime sees (``npu_count``).
    Under SHOAL_DEVICE_INVENTORY: the number of declared GPUs, whatever the driver says.
    """
    env = os.environ if environ is None else environ
    declared = declared_gpus(env)
    if declared is not None:
        return len(declared)
    nvidia = _nvidia_count(proc_dir, env)
    return nvidia if nvidia > 0 else npu_count(env)


def _nvidia_count(proc_dir: str, env: Mapping[str, str]) -> int:
    try:
        installed = len([e for e in os.listdir(proc_dir) if not e.startswith(".")])
    except OSError:
        return 0
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return installed
    return min(len(cuda_visible_entries(visible, installed)), installed)


def npu_count(environ: Mapping[str, str] | None = None) -> int:
    """Ascend NPUs visible to ``torch_npu`` (0 when it is not installed, does not import, or
    finds none), asked in a child interpreter with ``environ`` so the caller imports no torch.
    The child runs only when ``torch_npu`` is installed (a spec lookup, no import)."""
    if importlib.util.find_spec("torch_npu") is None:
        return 0
    env = tuple(sorted((os.environ if environ is None else environ).items()))
    return _npu_count_in_child(env)


@functools.lru_cache(maxsize=8)
def _npu_count_in_child(environ: tuple[tuple[str, str], ...]) -> int:
    """``npu_count``'s child run, once per environment (the broker asks more than once)."""
    env = dict(environ)
    try:
        done = subprocess.run([sys.executable, "-c", _NPU_COUNT_SCRIPT], env=env,
                              capture_output=True, text=True, timeout=_NPU_COUNT_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("counting Ascend NPUs through torch_npu failed (%s); none used", exc)
        return 0
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not lines[-1].isdigit():
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
        logger.warning("torch_npu is installed but counting NPUs failed (%s); none used",
                       reason)
        return 0
    return int(lines[-1])


def cuda_visible_entries(visible: str, installed: int) -> list[str]:
    """The entries of a CUDA_VISIBLE_DEVICES value the CUDA runtime keeps, in order (the
    visible device ids 0..len-1): the list up to its first invalid entry, where an index must
    be below ``installed``, a UUID starts "GPU-" or "MIG-", and a repeat is invalid."""
    kept: list[str] = []
    for raw in visible.split(","):
        entry = raw.strip()
        if entry.isdigit():
            if int(entry) >= installed:
                break
        elif not entry.startswith(("GPU-", "MIG-")):
            break
        if entry in kept:
            break
        kept.append(entry)
    return kept
