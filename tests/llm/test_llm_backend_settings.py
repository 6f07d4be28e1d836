"""The ``llm`` backend's config parameters: where the checkpoint may live, executor settings,
refusals that name the parameter."""

from __future__ import annotations

import pathlib

import pytest

from shoal.errors import ShoalError
from shoal.llm import CapacitySchedulerPolicy
from shoal.workers.backends.llm.settings import read_settings


def _model(tmp_path: pathlib.Path) -> pathlib.Path:
    model = tmp_path / "llm"
    (model / "checkpoint").mkdir(parents=True)
    return model


def test_checkpoint_relative_to_the_model_folder_and_executor_settings(
        tmp_path: pathlib.Path) -> None:
    model = _model(tmp_path)
    settings = read_settings(
        {"checkpoint_dir": "checkpoint", "max_num_sequences": "8", "kv_cache_num_blocks": "40",
         "batch_scheduler_policy": "max_utilization", "max_beam_width": "2",
         "exclude_input_in_output": "true", "shoal_execution_timeout_secs": "5"},
        str(model), "cpu", {})
    assert settings.checkpoint_dir == (model / "checkpoint").resolve()
    config = settings.executor_config
    assert (config.max_batch_size, config.kv_cache_config.num_blocks, config.max_beam_width) == \
        (8, 40, 2)
    assert config.scheduler_config.capacity_scheduler_policy is \
        CapacitySchedulerPolicy.MAX_UTILIZATION
    assert settings.exclude_input_in_output


@pytest.mark.parametrize("value", ["../elsewhere", "/"])
def test_checkpoint_outside_the_model_folder_is_refused(tmp_path: pathlib.Path,
                                                        value: str) -> None:
    model = _model(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(ShoalError, match=r"outside the model's folder.*checkpoint-roots"):
        read_settings({"checkpoint_dir": value}, str(model), "cpu", {})


def test_a_symlink_out_of_the_model_folder_is_refused(tmp_path: pathlib.Path) -> None:
    model = _model(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (model / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ShoalError, match="outside the model's folder"):
        read_settings({"checkpoint_dir": "link"}, str(model), "cpu", {})


def test_an_allowed_root_admits_an_absolute_checkpoint(tmp_path: pathlib.Path) -> None:
    model = _model(tmp_path)
    shared = tmp_path / "shared" / "ckpt"
    shared.mkdir(parents=True)
    settings = read_settings({"checkpoint_dir": str(shared)}, str(model), "cpu",
                             {"checkpoint-roots": str(tmp_path / "shared")})
    assert settings.checkpoint_dir == shared.resolve()


@pytest.mark.parametrize(("parameters", "named"), [
    ({}, "checkpoint_dir"),
    ({"checkpoint_dir": "missing"}, "checkpoint_dir"),
    ({"checkpoint_dir": "checkpoint", "max_num_sequences": "x"}, "max_num_sequences"),
    ({"checkpoint_dir": "checkpoint", "max_num_tokens": "0"}, "max_num_tokens"),
    ({"checkpoint_dir": "checkpoint", "batch_scheduler_policy": "fifo"},
     "batch_scheduler_policy"),
    ({"checkpoint_dir": "checkpoint", "kv_cache_num_blocks": "4",
      "max_tokens_in_paged_kv_cache": "128"}, "kv_cache_num_blocks and"),
    ({"checkpoint_dir": "checkpoint", "iter_stats_max_iterations": "-1"},
     "iter_stats_max_iterations must be >= 0"),
    ({"checkpoint_dir": "checkpoint", "request_stats_max_iterations": "x"},
     "request_stats_max_iterations must be an integer"),
    ({"checkpoint_dir": "checkpoint", "kv_cache_free_gpu_mem_fraction": "1.5"}, "(0, 1]"),
    ({"checkpoint_dir": "checkpoint", "max_batch": "4"}, "max_batch"),
    ({"checkpoint_dir": "checkpoint", "enable_kv_cache_reuse": "maybe"},
     "enable_kv_cache_reuse"),
    ({"checkpoint_dir": "checkpoint", "enable_chunked_context": "2"}, "enable_chunked_context"),
])
def test_bad_parameters_are_refused_by_name(tmp_path: pathlib.Path,
                                            parameters: dict[str, str], named: str) -> None:
    model = _model(tmp_path)
    with pytest.raises(ShoalError) as caught:
        read_settings(parameters, str(model), "cpu", {})
    assert named in caught.value.message


def test_block_reuse_is_on_and_chunked_context_off_unless_configured(
        tmp_path: pathlib.Path) -> None:
    model = _model(tmp_path)
    default = read_settings({"checkpoint_dir": "checkpoint"}, str(model), "cpu", {})
    assert default.executor_config.kv_cache_config.enable_block_reuse
    assert not default.executor_config.enable_chunked_context
    flipped = read_settings({"checkpoint_dir": "checkpoint", "enable_kv_cache_reuse": "false",
                             "enable_chunked_context": "True"}, str(model), "cpu", {})
    assert not flipped.executor_config.kv_cache_config.enable_block_reuse
    assert flipped.executor_config.enable_chunked_context
