"""openvino auto-complete as Triton's openvino backend does it: batching from batch layouts,
default-max-batch-size, dynamic_batching added, inputs / outputs filled only when absent; and
the throw-away interpreter that reads a real model (and fails cleanly on a corrupt one)."""

from __future__ import annotations

import pathlib

import pytest
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.errors import ShoalError
from shoal.workers.backends.openvino.autocomplete import (
    ModelTensor,
    complete_config,
    needs_model,
    openvino_auto_complete,
)


def config(text: str = "") -> ModelConfig:
    return text_format.Parse(text, ModelConfig())


def io(completed: ModelConfig) -> tuple[list[tuple[str, int, list[int]]], ...]:
    return tuple([(t.name, t.data_type, list(t.dims)) for t in ios]
                 for ios in (completed.input, completed.output))


BATCHING = [ModelTensor("x", "FP32", (-1, 4), True)], [ModelTensor("y", "FP32", (-1, 3), True)]
NO_LAYOUT = [ModelTensor("x", "INT32", (2, 3), False)], [ModelTensor("y", "INT32", (3,), False)]


def test_batch_layouts_fill_max_batch_size_dynamic_batching_and_ios() -> None:
    completed = complete_config(config(), *BATCHING, default_max_batch_size=4)
    assert completed.max_batch_size == 4
    assert completed.HasField("dynamic_batching")
    assert io(completed) == ([("x", 11, [4])], [("y", 11, [3])])  # TYPE_FP32 == 11


def test_without_batch_layouts_the_model_does_not_batch() -> None:
    completed = complete_config(config(), *NO_LAYOUT, default_max_batch_size=4)
    assert completed.max_batch_size == 0
    assert not completed.HasField("dynamic_batching")
    assert io(completed) == ([("x", 8, [2, 3])], [("y", 8, [3])])  # TYPE_INT32 == 8


def test_given_max_batch_size_and_scheduler_are_kept() -> None:
    kept = complete_config(config("max_batch_size: 16 sequence_batching {}"), *BATCHING, 4)
    assert kept.max_batch_size == 16 and not kept.HasField("dynamic_batching")
    # a non-zero max_batch_size on a model without batch layouts stays (Triton only warns)
    assert complete_config(config("max_batch_size: 2"), *NO_LAYOUT, 4).max_batch_size == 2


def test_default_max_batch_size_is_at_least_one() -> None:
    completed = complete_config(config(), *BATCHING, default_max_batch_size=0)
    assert completed.max_batch_size == 1 and not completed.HasField("dynamic_batching")


def test_given_inputs_are_kept_and_missing_outputs_filled() -> None:
    partial = config('max_batch_size: 2 input [ { name: "x" data_type: TYPE_FP16 dims: [4] } ]')
    completed = complete_config(partial, *BATCHING, 4)
    assert io(completed) == ([("x", 10, [4])], [("y", 11, [3])])  # the given FP16 stays


def test_the_model_is_read_only_when_it_can_change_the_config() -> None:
    full = 'input [ { name: "x" } ] output [ { name: "y" } ] '
    assert needs_model(config(full))  # max_batch_size 0 may become the default
    assert needs_model(config(full + "max_batch_size: 8"))  # may get dynamic_batching
    assert not needs_model(config(full + "max_batch_size: 8 dynamic_batching {}"))
    assert not needs_model(config(full + "max_batch_size: 1"))


def test_the_throw_away_interpreter_reads_a_real_model(tmp_path: pathlib.Path) -> None:
    models = pytest.importorskip("tests.openvino_models")
    models.write_ir(tmp_path / "mlp" / "1", models.mlp())
    completed = openvino_auto_complete(str(tmp_path / "mlp"), config('name: "mlp"'), 8)
    assert completed.max_batch_size == 8 and completed.HasField("dynamic_batching")
    assert io(completed) == ([("x", 11, [4])], [("y", 11, [3])])


def test_a_corrupt_model_fails_auto_complete_with_a_clear_error(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("openvino")
    (tmp_path / "bad" / "1").mkdir(parents=True)
    (tmp_path / "bad" / "1" / "model.xml").write_text("not a real model")
    with pytest.raises(ShoalError) as failure:
        openvino_auto_complete(str(tmp_path / "bad"), config('name: "bad"'), 4)
    message = failure.value.message
    assert message.startswith("bad: auto-complete from the OpenVINO model failed: cannot read "
                              "the model: Unable to read the model")
    assert str(tmp_path) not in message
