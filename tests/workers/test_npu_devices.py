"""Ascend NPU counting and mapping (issue #15 part 5) with a stand-in ``torch_npu`` that reports
two devices: the broker-side count asks the runtime in a child interpreter when no NVIDIA GPU is
present, and the worker maps a KIND_GPU / KIND_MODEL instance to "npu:<id>"."""

from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Iterator

import pytest
import torch

from shoal.errors import ErrorCode, ShoalError
from shoal.process.devices import npu_count, resolve_device, visible_gpu_count
from tests.workers.fake_npu import write_fake_torch_npu

# The count runs a child interpreter that imports torch: slow on a loaded machine.
pytestmark = pytest.mark.timeout(300)

# Declared devices (SHOAL_DEVICE_INVENTORY, the test suite's fake GPUs) win over the NPU count:
# kept out of every environment here.
DECLARED_DEVICES = ("SHOAL_DEVICE_INVENTORY", "SHOAL_FAKE_GPUS")


@pytest.fixture
def fake_npus(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Two stand-in NPUs, importable here (sys.path) and in children (the returned env)."""
    root = write_fake_torch_npu(tmp_path / "site", 2)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(torch, "npu", None, raising=False)  # restored (removed) afterwards
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    for key in DECLARED_DEVICES:
        env.pop(key, None)
    yield env
    sys.modules.pop("torch_npu", None)


def test_runtime_count_is_used_without_nvidia_gpus(fake_npus: dict[str, str],
                                                   tmp_path: pathlib.Path) -> None:
    assert npu_count(fake_npus) == 2
    assert visible_gpu_count(str(tmp_path / "no-nvidia-driver"), fake_npus) == 2


def test_nvidia_gpus_win_over_npus(fake_npus: dict[str, str], tmp_path: pathlib.Path) -> None:
    proc = tmp_path / "gpus"
    (proc / "0000:01:00.0").mkdir(parents=True)
    assert visible_gpu_count(str(proc), fake_npus) == 1


def test_no_torch_npu_counts_nothing(tmp_path: pathlib.Path) -> None:
    env = {key: value for key, value in os.environ.items() if key not in DECLARED_DEVICES}
    assert npu_count(env) == 0
    assert visible_gpu_count(str(tmp_path / "no-nvidia-driver"), env) == 0


def test_instances_map_to_npu_devices(fake_npus: dict[str, str]) -> None:
    env = {key: value for key, value in fake_npus.items() if key not in DECLARED_DEVICES}
    assert resolve_device("KIND_GPU", 1, env) == "npu:1"
    assert resolve_device("MODEL", 0, env) == "npu:0"
    with pytest.raises(ShoalError) as caught:
        resolve_device("GPU", 2, env)
    assert caught.value.code == ErrorCode.INVALID_ARG
    assert "asks for npu device 2, but only 2 npu device(s) are visible" in caught.value.message
