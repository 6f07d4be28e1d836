"""The start-up warning for a CUDA build of torch on a machine without an NVIDIA GPU: torch's
version.py read without importing torch, the driver's /proc entries, and the one log line."""

from __future__ import annotations

import importlib.machinery
import logging
import pathlib
import sys
from collections.abc import Callable

import pytest

from shoal.process import torch_build


def fake_torch(tmp_path: pathlib.Path, version_py: str) -> pathlib.Path:
    package = tmp_path / "site" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('torch must not be imported')\n")
    (package / "version.py").write_text(version_py)
    return package.parent


@pytest.fixture
def only_fake_torch(monkeypatch: pytest.MonkeyPatch,
                    tmp_path: pathlib.Path) -> Callable[[str], None]:
    def install(version_py: str) -> None:
        site = fake_torch(tmp_path, version_py)
        monkeypatch.setattr(sys, "path", [str(site)])
        monkeypatch.delitem(sys.modules, "torch", raising=False)
        importlib.machinery.PathFinder.invalidate_caches()
    return install


def test_the_cuda_version_of_a_cuda_build(only_fake_torch: Callable[[str], None]) -> None:
    only_fake_torch("__version__ = '2.13.0'\ncuda: Optional[str] = '12.8'\nhip = None\n")
    assert torch_build.torch_cuda_version() == "12.8"
    assert "torch" not in sys.modules


def test_a_cpu_build_has_none(only_fake_torch: Callable[[str], None]) -> None:
    only_fake_torch("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n")
    assert torch_build.torch_cuda_version() is None


def test_no_torch_has_none(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert torch_build.torch_cuda_version() is None


def test_a_gpu_is_a_driver_entry(tmp_path: pathlib.Path) -> None:
    assert not torch_build.machine_has_nvidia_gpu(str(tmp_path / "absent"))
    assert not torch_build.machine_has_nvidia_gpu(str(tmp_path))
    (tmp_path / "0000:01:00.0").mkdir()
    assert torch_build.machine_has_nvidia_gpu(str(tmp_path))


def test_the_message_only_for_cuda_without_gpu() -> None:
    assert torch_build.cuda_torch_without_gpu_message(None, has_gpu=False) is None
    assert torch_build.cuda_torch_without_gpu_message("12.8", has_gpu=True) is None
    message = torch_build.cuda_torch_without_gpu_message("12.8", has_gpu=False)
    assert message is not None
    assert "CUDA 12.8 build" in message and torch_build.CPU_TORCH_FIX in message


def test_one_warning_at_start(monkeypatch: pytest.MonkeyPatch,
                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(torch_build, "torch_cuda_version", lambda: "12.8")
    monkeypatch.setattr(torch_build, "machine_has_nvidia_gpu", lambda: False)
    with caplog.at_level(logging.WARNING, logger=torch_build.__name__):
        torch_build.warn_if_cuda_torch_without_gpu()
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "pip install --force-reinstall torch==2.13.0" in caplog.records[0].getMessage()


def test_never_raises(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> str:
        raise RuntimeError("unreadable")
    monkeypatch.setattr(torch_build, "torch_cuda_version", broken)
    torch_build.warn_if_cuda_torch_without_gpu()
    assert not caplog.records


def test_this_machines_torch_is_read_without_importing_it() -> None:
    if "torch" in sys.modules:
        pytest.skip("torch already imported in this process")
    torch_build.torch_cuda_version()
    assert "torch" not in sys.modules
