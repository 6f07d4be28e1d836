"""The llm worker's torch thread count: config parameter, backend setting, default share."""

from __future__ import annotations

import os

import pytest
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.errors import ErrorCode, ShoalError
from shoal.workers.backends.llm.threads import thread_count


def config(instances: str) -> ModelConfig:
    return text_format.Parse(f'name: "llm" backend: "llm" {instances}', ModelConfig())


ONE_CPU = config("instance_group [ { count: 1 kind: KIND_CPU } ]")


def test_parameter_wins_over_setting() -> None:
    assert thread_count({"INTRA_OP_THREAD_COUNT": "3"}, {"intra-op-thread-count": "5"},
                        ONE_CPU, "cpu") == 3


def test_backend_setting_when_no_parameter() -> None:
    assert thread_count({}, {"intra-op-thread-count": "5"}, ONE_CPU, "cpu") == 5


def test_default_leaves_a_core_to_the_frontend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert thread_count({}, {}, ONE_CPU, "cpu") == 7
    two = config("instance_group [ { count: 2 kind: KIND_CPU } ]")
    assert thread_count({}, {}, two, "cpu") == 3


def test_default_is_one_thread_on_two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert thread_count({}, {}, ONE_CPU, "cpu") == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert thread_count({}, {}, ONE_CPU, "cpu") == 1


def test_the_servers_thread_policy_replaces_the_per_model_default() -> None:
    assert thread_count({}, {}, ONE_CPU, "cpu", policy=3) == 3
    assert thread_count({"INTRA_OP_THREAD_COUNT": "2"}, {}, ONE_CPU, "cpu", policy=3) == 2
    gpu = config("instance_group [ { count: 1 kind: KIND_GPU } ]")
    assert thread_count({}, {}, gpu, "cuda:0", policy=3) == 1


def test_accelerator_instance_keeps_one_host_thread() -> None:
    gpu = config("instance_group [ { count: 1 kind: KIND_GPU } ]")
    assert thread_count({}, {}, gpu, "cuda:0") == 1


@pytest.mark.parametrize("text", ["0", "-2", "two"])
def test_bad_count_is_refused_naming_the_parameter(text: str) -> None:
    with pytest.raises(ShoalError) as caught:
        thread_count({"INTRA_OP_THREAD_COUNT": text}, {}, ONE_CPU, "cpu")
    assert caught.value.code == ErrorCode.INVALID_ARG
    assert "INTRA_OP_THREAD_COUNT" in caught.value.message


def test_configure_threads_sets_torchs_count() -> None:
    import torch

    from shoal.workers.backends.llm.threads import configure_threads

    before = torch.get_num_threads()
    try:
        assert configure_threads({"INTRA_OP_THREAD_COUNT": "1"}, {}, ONE_CPU, "cpu") == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
