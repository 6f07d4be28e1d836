from __future__ import annotations

import pathlib

import pytest
import torch

from shoal.errors import ErrorCode, ShoalError
from shoal.process.devices import fake_gpus, parse_byte_size, resolve_device, visible_gpu_count


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


# ------------------------------------------------------------------ test-only fake GPUs


FAKE = {"SHOAL_FAKE_GPUS": "0:2GiB,1:2GiB"}


def test_fake_gpus_are_the_visible_count(four_gpus: str, tmp_path: pathlib.Path) -> None:
    assert visible_gpu_count(four_gpus, {**FAKE, "CUDA_VISIBLE_DEVICES": "0"}) == 2
    assert visible_gpu_count(str(tmp_path / "absent"), {"SHOAL_FAKE_GPUS": "0:1GiB"}) == 1


def test_fake_gpus_run_on_the_cpu() -> None:
    assert resolve_device("GPU", 0, FAKE) == "cpu"
    assert resolve_device("KIND_GPU", 1, FAKE) == "cpu"
    assert resolve_device("MODEL", 0, FAKE) == "cpu"
    assert resolve_device("CPU", 0, FAKE) == "cpu"
    with pytest.raises(ShoalError) as info:
        resolve_device("GPU", 2, FAKE)
    assert info.value.code == ErrorCode.INVALID_ARG
    assert "GPU device 2" in info.value.message and "only 2 device(s)" in info.value.message


@pytest.mark.parametrize("value", [None, "", "  "])
def test_unset_fake_changes_nothing(four_gpus: str, value: str | None) -> None:
    env = {"CUDA_VISIBLE_DEVICES": "1,3"} | ({} if value is None else {"SHOAL_FAKE_GPUS": value})
    assert fake_gpus(env) is None
    assert visible_gpu_count(four_gpus, env) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_unset_fake_leaves_resolve_device_alone() -> None:
    with pytest.raises(ShoalError, match="KIND_GPU needs a CUDA or Ascend NPU device"):
        resolve_device("GPU", 0, {})


def test_fake_gpus_parse_sizes() -> None:
    assert fake_gpus({"SHOAL_FAKE_GPUS": "1:512MiB, 0:3000000000"}) == {
        0: 3_000_000_000, 1: 512 << 20}


@pytest.mark.parametrize("value", [
    "2GiB", "0:", "0:0", "a:1GiB", "-1:1GiB", "0:1GiB,0:1GiB", "0:1GiB,2:1GiB", "0:1GiB,",
    "0:1 XB",
])
def test_malformed_fake_gpus_are_a_clear_error(value: str) -> None:
    with pytest.raises(ShoalError) as info:
        visible_gpu_count("/nonexistent", {"SHOAL_FAKE_GPUS": value})
    assert info.value.code == ErrorCode.INVALID_ARG
    assert "SHOAL_FAKE_GPUS (test-only) must be '<id>:<size>,...'" in info.value.message
    assert value in info.value.message


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
