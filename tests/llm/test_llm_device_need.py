"""The device-memory ledger's estimate of an llm-backend instance (``broker/lifecycle/
llm_need.py``, torch-free, for the broker) equals what the executor really allocates: its KV
pool's bytes for each way of sizing the pool, on both model families."""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import pytest

from shoal.llm import Executor
from shoal.workers.backends.llm.device_need import llm_instance_bytes
from shoal.workers.backends.llm.settings import read_settings


@pytest.mark.parametrize("sizing", [
    {"kv_cache_num_blocks": "7"},
    {"max_tokens_in_paged_kv_cache": "100", "kv_cache_tokens_per_block": "16"},
    {"max_num_sequences": "3", "max_seq_len": "40"},
    {"max_num_sequences": "2", "max_beam_width": "2"},  # the model's max_seq_len
])
def test_kv_pool_bytes_equal_the_executors(model_dir: pathlib.Path, sizing: dict[str, str],
                                           make_executor: Callable[..., Executor]) -> None:
    parameters = {"checkpoint_dir": model_dir.name, **sizing}
    settings = read_settings(parameters, str(model_dir.parent), "cpu", {})
    executor = make_executor(model_dir, settings.executor_config)
    need = llm_instance_bytes(parameters, str(model_dir.parent))
    assert need is not None
    assert need["kv_pool"] == executor.kv.nbytes
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    assert need["weights"] == weights  # float32 checkpoint loaded as float32


def test_a_load_dtype_scales_the_weights_and_the_pool(model_dir: pathlib.Path) -> None:
    base = {"checkpoint_dir": model_dir.name, "kv_cache_num_blocks": "4"}
    full = llm_instance_bytes(base, str(model_dir.parent))
    half = llm_instance_bytes({**base, "dtype": "float16"}, str(model_dir.parent))
    assert full is not None and half is not None
    assert half["kv_pool"] * 2 == full["kv_pool"]
    assert half["weights"] * 2 == full["weights"]


def test_a_fraction_takes_its_share_of_the_room_left_by_the_weights(
        model_dir: pathlib.Path) -> None:
    parameters = {"checkpoint_dir": model_dir.name, "kv_cache_free_gpu_mem_fraction": "0.5"}
    need = llm_instance_bytes(parameters, str(model_dir.parent), free_bytes=64 << 20)
    assert need is not None
    assert 0 < need["kv_pool"] <= ((64 << 20) - need["weights"]) // 2


def test_an_unreadable_checkpoint_gives_none(tmp_path: pathlib.Path) -> None:
    assert llm_instance_bytes({"checkpoint_dir": "missing"}, str(tmp_path)) is None
