"""Which torch build is installed, told once at start when it is the wrong one for the machine.

pip cannot ask for torch's CPU build: ``pip install shoal`` on a machine without a GPU resolves
PyPI's default Linux torch, the CUDA build, and its nvidia-* wheels (several GB that never run
there). ``warn_if_cuda_torch_without_gpu`` logs one warning with the fix at start-up when torch
is a CUDA build and the machine shows no NVIDIA GPU. The supervisor never imports torch (hundreds
of MB, seconds), so nothing here does: torch's ``version.py`` is read as text where
``importlib.util.find_spec`` locates the package, and a GPU is the NVIDIA driver's
/proc/driver/nvidia/gpus entries (as ``devices.visible_gpu_count`` counts them).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import pathlib
import re
from typing import Final

from shoal.process.devices import NVIDIA_PROC_GPUS

logger = logging.getLogger(__name__)

CPU_TORCH_FIX: Final = ("pip install --force-reinstall torch==2.13.0 --index-url "
                        "https://download.pytorch.org/whl/cpu")
_CUDA_LINE: Final = re.compile(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)


def torch_cuda_version() -> str | None:
    """The CUDA version the installed torch was built for ("12.8"), or None: a CPU (or ROCm,
    XPU) build, no torch, or a torch whose version.py cannot be read. Does not import torch."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        try:
            text = (pathlib.Path(location) / "version.py").read_text(encoding="utf-8")
        except OSError:
            continue
        match = _CUDA_LINE.search(text)
        return match.group(1) if match else None
    return None


def machine_has_nvidia_gpu(proc_gpus: str = NVIDIA_PROC_GPUS) -> bool:
    """True when the NVIDIA driver lists at least one GPU (CUDA_VISIBLE_DEVICES is not read:
    a GPU hidden from this server still makes the CUDA build the right one for the machine)."""
    try:
        with os.scandir(proc_gpus) as entries:
            return any(True for _ in entries)
    except OSError:
        return False


def cuda_torch_without_gpu_message(cuda: str | None, has_gpu: bool) -> str | None:
    """The warning for a CUDA build of torch on a machine without a GPU; None otherwise."""
    if cuda is None or has_gpu:
        return None
    return (f"torch is a CUDA {cuda} build but this machine has no NVIDIA GPU: models run on "
            f"the CPU, and the CUDA build and its nvidia-* packages only take disk and start-up "
            f"time; install the CPU build: {CPU_TORCH_FIX}")


def warn_if_cuda_torch_without_gpu() -> None:
    """Log the one warning (see the module docstring); never raises."""
    try:
        message = cuda_torch_without_gpu_message(torch_cuda_version(), machine_has_nvidia_gpu())
    except Exception:  # a start-up hint must never stop the server
        return
    if message is not None:
        logger.warning("%s", message)
