"""TensorRT-LLM's ``tensorrt_llm`` model parameters on the llm backend
(``trtllm_parameters.normalize_parameters`` then ``read_settings``): honoured, mapped, ignored
(named for the one warning) and unfilled fill_template placeholders (not set)."""

from __future__ import annotations

import pathlib

import pytest

from shoal.errors import ShoalError
from shoal.llm import BatchingType
from shoal.workers.backends.llm.settings import read_settings
from shoal.workers.backends.llm.trtllm_parameters import (
    IGNORED,
    ignored_warning,
    is_placeholder,
    normalize_parameters,
)


def test_placeholders_are_unset_and_not_named_as_ignored() -> None:
    got = normalize_parameters({"max_beam_width": "${max_beam_width}",
                                "gpu_device_ids": "${gpu_device_ids}",
                                "gpt_model_path": " ${engine_dir} "}, accelerator=False)
    assert got.values == {}
    assert got.ignored == ()
    assert got.unset == ("gpt_model_path", "gpu_device_ids", "max_beam_width")
    assert not is_placeholder("a${b}") and not is_placeholder("") and is_placeholder("${}")


def test_engine_path_names_the_checkpoint_and_ignored_ones_are_dropped() -> None:
    got = normalize_parameters({"gpt_model_path": "/models/llm/ckpt", "gpu_device_ids": "0,1",
                                "FORCE_CPU_ONLY_INPUT_TENSORS": "no", "max_beam_width": "2",
                                "kv_cache_free_gpu_mem_fraction": "0.5",
                                "normalize_log_probs": "true"}, accelerator=False)
    assert got.values == {"checkpoint_dir": "/models/llm/ckpt", "max_beam_width": "2"}
    assert got.ignored == ("FORCE_CPU_ONLY_INPUT_TENSORS", "gpu_device_ids",
                           "kv_cache_free_gpu_mem_fraction")
    warning = ignored_warning("m", got.ignored)
    assert warning.endswith("FORCE_CPU_ONLY_INPUT_TENSORS, gpu_device_ids, "
                            "kv_cache_free_gpu_mem_fraction")


def test_gpu_fraction_is_honoured_on_a_gpu_and_normalize_false_is_ignored() -> None:
    got = normalize_parameters({"kv_cache_free_gpu_mem_fraction": "0.5",
                                "normalize_log_probs": "false"}, accelerator=True)
    assert got.values == {"kv_cache_free_gpu_mem_fraction": "0.5"}
    assert got.ignored == ("normalize_log_probs",)


def test_two_different_checkpoints_are_refused() -> None:
    with pytest.raises(ShoalError, match="checkpoint_dir 'a' and gpt_model_path 'b'"):
        normalize_parameters({"checkpoint_dir": "a", "gpt_model_path": "b"}, accelerator=False)
    same = normalize_parameters({"checkpoint_dir": "a", "gpt_model_path": "a"},
                                accelerator=False)
    assert same.values == {"checkpoint_dir": "a"}


def test_every_ignored_name_passes_read_settings(tmp_path: pathlib.Path) -> None:
    """All of IGNORED set at once: nothing left for read_settings to refuse; the honoured
    TensorRT-LLM parameters reach the executor config."""
    (tmp_path / "ckpt").mkdir()
    raw = {name: "1" for name in IGNORED} | {
        "gpt_model_path": "ckpt", "gpt_model_type": "V1", "max_tokens_in_paged_kv_cache": "640",
        "kv_cache_free_gpu_mem_fraction": "0.9", "iter_stats_max_iterations": "5",
        "request_stats_max_iterations": "0", "enable_kv_cache_reuse": "false",
        "batch_scheduler_policy": "guaranteed_no_evict"}
    got = normalize_parameters(raw, accelerator=False)
    assert set(got.ignored) == IGNORED | {"kv_cache_free_gpu_mem_fraction"}
    config = read_settings(got.values, str(tmp_path), "cpu", {}).executor_config
    assert config.batching_type is BatchingType.STATIC
    assert config.kv_cache_config.max_tokens == 640
    assert not config.kv_cache_config.enable_block_reuse
    assert (config.iter_stats_max_iterations, config.request_stats_max_iterations) == (5, 0)


def test_unknown_parameters_are_still_refused(tmp_path: pathlib.Path) -> None:
    (tmp_path / "ckpt").mkdir()
    got = normalize_parameters({"gpt_model_path": "ckpt", "max_beam_widht": "2"},
                               accelerator=False)
    with pytest.raises(ShoalError, match=r"unknown config parameter.*max_beam_widht"):
        read_settings(got.values, str(tmp_path), "cpu", {})
