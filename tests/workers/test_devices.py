from __future__ import annotations

import os
import pathlib

import pytest
import torch

from shoal.errors import ErrorCode, ShoalError
from shoal.process.devices import (
    declared_gpus,
    parse_byte_size,
    resolve_device,
    visible_gpu_count,
)
from tests.fakes.gpus import PROVIDER, fake_gpus_env, inventory


def test_cpu_kind_maps_to_cpu() -> None:
    assert resolve_device("CPU", 0) == "cpu"
    assert resolve_device("KIND_CPU", 3) == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_gpu_kind_without_a_device_is_a_clear_error() -> None:
    with pytest.raises(ShoalError) as info:
        resolve_device("GPU", 0)
    assert info.value.code == ErrorCode.INVALID_ARG
    assert "KIND_GPU needs a CUDA or Ascend NPU device" in info.value.message
    assert "KIND_CPU" in info.value.message


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_model_kind_without_an_accelerator_runs_on_cpu() -> None:
    assert resolve_device("MODEL", 0) == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_kind_maps_to_the_cuda_device() -> None:
    assert resolve_device("GPU", 0) == "cuda:0"
    with pytest.raises(ShoalError, match="only"):
        resolve_device("GPU", torch.cuda.device_count())


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ShoalError, match="unknown instance group kind 'TPU'"):
        resolve_device("TPU", 0)


@pytest.fixture
def four_gpus(tmp_path: pathlib.Path) -> str:
    for i in range(4):
        (tmp_path / f"0000:0{i}:00.0").mkdir()
    return str(tmp_path)


@pytest.mark.parametrize(("visible", "expected"), [
    (None, 4), ("", 0), ("1,3", 2), ("0,7,1", 1), ("GPU-8d7e9f", 1), ("-1", 0), ("2,2", 1),
])
def test_visible_gpu_count_applies_cuda_visible_devices(four_gpus: str, visible: str | None,
                                                        expected: int) -> None:
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert visible_gpu_count(four_gpus, env) == expected


def test_visible_gpu_count_is_zero_without_the_driver(tmp_path: pathlib.Path) -> None:
    assert visible_gpu_count(str(tmp_path / "absent"), {}) == 0


# ------------------------------------------------------------------ declared devices (the hook)


def two_gpus() -> dict[int, int]:
    return {1: 512 << 20, 0: 3_000_000_000}


def no_gpus() -> dict[int, int]:
    return {}


def a_list() -> object:
    return [1 << 30]


def gappy() -> dict[int, int]:
    return {0: 1 << 30, 2: 1 << 30}


def zero_sized() -> dict[int, int]:
    return {0: 0}


def a_float_size() -> dict[int, float]:
    return {0: 1.5e9}


def a_bool_id() -> dict[bool, int]:
    return {False: 1 << 30}


def broken() -> dict[int, int]:
    raise RuntimeError("no inventory today")


NOT_CALLABLE = {0: 1 << 30}


def hook(name: str) -> dict[str, str]:
    """An environment whose SHOAL_DEVICE_INVENTORY names ``name`` in this module."""
    return {"SHOAL_DEVICE_INVENTORY": f"{__name__}:{name}"}


@pytest.mark.parametrize("value", [None, "", "  "])
def test_an_unset_inventory_declares_nothing(four_gpus: str, value: str | None) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "1,3"} | (
        {} if value is None else {"SHOAL_DEVICE_INVENTORY": value})
    assert declared_gpus(env) is None
    assert visible_gpu_count(four_gpus, env) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_an_unset_inventory_leaves_resolve_device_alone() -> None:
    with pytest.raises(ShoalError, match="KIND_GPU needs a CUDA or Ascend NPU device"):
        resolve_device("GPU", 0, {})


def test_the_provider_declares_the_gpus(four_gpus: str) -> None:
    assert declared_gpus(hook("two_gpus")) == {0: 3_000_000_000, 1: 512 << 20}
    assert list(declared_gpus(hook("two_gpus")) or {}) == [0, 1]  # in id order
    assert declared_gpus({"SHOAL_DEVICE_INVENTORY": f" {__name__} : two_gpus "}) is not None
    assert visible_gpu_count(four_gpus, {**hook("two_gpus"), "CUDA_VISIBLE_DEVICES": "0"}) == 2
    assert declared_gpus(hook("no_gpus")) == {}
    assert visible_gpu_count(four_gpus, hook("no_gpus")) == 0


@pytest.mark.parametrize(("value", "problem"), [
    ("tests.workers", "not '<package.module>:<name>'"),
    (":two_gpus", "not '<package.module>:<name>'"),
    (f"{__name__}:", "not '<package.module>:<name>'"),
    (f"{__name__}:two-gpus", "not '<package.module>:<name>'"),
    ("tests.no_such_module:inventory", "cannot import 'tests.no_such_module': "
                                       "ModuleNotFoundError"),
    (f"{__name__}:absent", f"'{__name__}' has no callable 'absent'"),
    (f"{__name__}:NOT_CALLABLE", f"'{__name__}' has no callable 'NOT_CALLABLE'"),
    (f"{__name__}:broken", "the provider failed: RuntimeError: no inventory today"),
    (f"{__name__}:a_list", "the provider returned a list, not a dict"),
    (f"{__name__}:gappy", "ids [0, 2] are not 0..1"),
    (f"{__name__}:zero_sized", "bad entry 0: 0"),
    (f"{__name__}:a_float_size", "bad entry 0: 1500000000.0"),
    (f"{__name__}:a_bool_id", "bad entry False"),
])
def test_a_failing_inventory_is_a_clear_error(four_gpus: str, value: str, problem: str) -> None:
    for ask in (lambda env: declared_gpus(env), lambda env: visible_gpu_count(four_gpus, env),
                lambda env: resolve_device("GPU", 0, env)):
        with pytest.raises(ShoalError) as info:
            ask({"SHOAL_DEVICE_INVENTORY": value})
        assert info.value.code == ErrorCode.INVALID_ARG
        assert info.value.message.startswith(
            "SHOAL_DEVICE_INVENTORY must be '<package.module>:<name>'"), info.value.message
        assert f"got '{value}'" in info.value.message and problem in info.value.message


def test_declared_gpus_run_on_the_cpu() -> None:
    env = hook("two_gpus")
    assert resolve_device("GPU", 0, env) == "cpu"
    assert resolve_device("KIND_GPU", 1, env) == "cpu"
    assert resolve_device("MODEL", 0, env) == "cpu"
    assert resolve_device("CPU", 0, env) == "cpu"
    with pytest.raises(ShoalError) as info:
        resolve_device("GPU", 2, env)
    assert info.value.code == ErrorCode.INVALID_ARG
    assert "GPU device 2" in info.value.message and "only 2 device(s)" in info.value.message
    assert "SHOAL_DEVICE_INVENTORY" in info.value.message


# ------------------------------------------------------------------ the test suite's fake GPUs


def test_fake_gpus_are_the_visible_count(four_gpus: str, tmp_path: pathlib.Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOAL_FAKE_GPUS", "0:2GiB,1:2GiB")
    env = {"SHOAL_DEVICE_INVENTORY": PROVIDER}
    assert visible_gpu_count(four_gpus, {**env, "CUDA_VISIBLE_DEVICES": "0"}) == 2
    monkeypatch.setenv("SHOAL_FAKE_GPUS", "0:1GiB")
    assert visible_gpu_count(str(tmp_path / "absent"), env) == 1


def test_fake_gpus_run_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOAL_FAKE_GPUS", "0:2GiB,1:2GiB")
    env = {"SHOAL_DEVICE_INVENTORY": PROVIDER}
    assert resolve_device("GPU", 0, env) == "cpu"
    assert resolve_device("KIND_GPU", 1, env) == "cpu"
    assert resolve_device("MODEL", 0, env) == "cpu"
    with pytest.raises(ShoalError, match="only 2 device"):
        resolve_device("GPU", 2, env)


def test_fake_gpus_parse_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOAL_FAKE_GPUS", "1:512MiB, 0:3000000000")
    assert inventory() == {0: 3_000_000_000, 1: 512 << 20}


@pytest.mark.parametrize("value", [
    "", "  ", "2GiB", "0:", "0:0", "a:1GiB", "-1:1GiB", "0:1GiB,0:1GiB", "0:1GiB,2:1GiB",
    "0:1GiB,", "0:1 XB",
])
def test_malformed_fake_gpus_are_a_clear_error(value: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOAL_FAKE_GPUS", value)
    with pytest.raises(ShoalError) as info:
        inventory()
    assert info.value.code == ErrorCode.INVALID_ARG
    assert "SHOAL_FAKE_GPUS (test-only) must be '<id>:<size>,...'" in info.value.message
    assert f"got '{value.strip()}'" in info.value.message
    # through the hook, the server's error names the hook and keeps the fake's message
    with pytest.raises(ShoalError) as hooked:
        visible_gpu_count("/nonexistent", {"SHOAL_DEVICE_INVENTORY": PROVIDER})
    assert hooked.value.code == ErrorCode.INVALID_ARG
    assert "SHOAL_DEVICE_INVENTORY" in hooked.value.message
    assert info.value.message in hooked.value.message


def test_fake_gpus_env_names_the_provider_and_makes_it_importable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = fake_gpus_env("0:1GiB")
    root = str(pathlib.Path(__file__).resolve().parents[2])
    assert env == {"SHOAL_DEVICE_INVENTORY": "tests.fakes.gpus:inventory",
                   "SHOAL_FAKE_GPUS": "0:1GiB", "PYTHONPATH": f"{root}{os.pathsep}/elsewhere"}
    monkeypatch.delenv("PYTHONPATH")
    assert fake_gpus_env("0:1GiB")["PYTHONPATH"] == root


@pytest.mark.parametrize(("text", "expected"), [
    ("1073741824", 1 << 30), ("512MiB", 512 << 20), ("1.5GiB", 3 << 29), ("2G", 2 << 30),
    ("2GB", 2_000_000_000), ("7 b", 7), ("0.1KiB", 103),
])
def test_parse_byte_size(text: str, expected: int) -> None:
    assert parse_byte_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "-1", "1 PiB", "1e9", "1,5GiB"])
def test_parse_byte_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a byte size"):
        parse_byte_size(text)
