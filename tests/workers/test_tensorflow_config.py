"""The tensorflow backend's config side, without TensorFlow: auto-complete from a signature by
Triton's rules, the signature reader on files that are not SavedModels, the platform inferred
from a version directory, and the registry serving the backend when TensorFlow is installed and
refusing it, naming the extra, when not."""

from __future__ import annotations

import pathlib
import textwrap
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.broker.repository import load_model_source
from shoal.config.model_config import config_to_json
from shoal.errors import ErrorCode, ShoalError
from shoal.workers.backends import registry
from shoal.workers.backends.tensorflow.autocomplete import (
    complete_config,
    tensorflow_auto_complete,
)
from shoal.workers.backends.tensorflow.signature import Signature, SignatureTensor, read_signature

BATCHING = Signature("serving_default",
                     [SignatureTensor("x", "FP32", (-1, 4)), SignatureTensor("s", "BYTES", (-1,))],
                     [SignatureTensor("y", "FP32", (-1, 3))])
FIXED = Signature("serving_default", [SignatureTensor("x", "INT64", (2, 3))],
                  [SignatureTensor("y", "INT64", (2, 3))])


def parse(text: str) -> ModelConfig:
    return text_format.Parse(textwrap.dedent(text), ModelConfig(name="m"))


def ios(config: ModelConfig, field: str) -> list[tuple[str, str, list[int], bool]]:
    doc: Any = config_to_json(config)
    return [(io["name"], io["data_type"], [int(d) for d in io["dims"]], "reshape" in io)
            for io in doc[field]]


def test_a_batching_signature_without_config_is_what_triton_writes() -> None:
    completed = complete_config(ModelConfig(name="m"), BATCHING, default_max_batch_size=4)
    assert completed.max_batch_size == 4
    assert completed.HasField("dynamic_batching")
    assert ios(completed, "input") == [("x", "TYPE_FP32", [4], False),
                                       ("s", "TYPE_STRING", [1], True)]  # rank 1: dims [1]
    assert ios(completed, "output") == [("y", "TYPE_FP32", [3], False)]


def test_a_fixed_signature_does_not_batch() -> None:
    completed = complete_config(ModelConfig(name="m"), FIXED, default_max_batch_size=4)
    assert completed.max_batch_size == 0 and not completed.HasField("dynamic_batching")
    assert ios(completed, "input") == [("x", "TYPE_INT64", [2, 3], False)]


def test_max_batch_size_on_a_signature_that_cannot_batch_is_an_error() -> None:
    with pytest.raises(ShoalError, match="configuration specified max-batch 8 but model "
                                         "signature does not support batching"):
        complete_config(parse("max_batch_size: 8"), FIXED, 4)


def test_config_dims_of_the_full_rank_say_no_batching() -> None:
    config = parse('input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]')
    completed = complete_config(config, BATCHING, 4)
    assert completed.max_batch_size == 0
    assert ios(completed, "output") == [("y", "TYPE_FP32", [-1, 3], False)]


def test_contradicting_config_dims_are_an_error() -> None:
    config = parse("""
        input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
    """)
    with pytest.raises(ShoalError, match="contradicting each other"):
        complete_config(config, BATCHING, 4)


def test_a_rank_zero_tensor_cannot_be_filled() -> None:
    scalar = Signature("serving_default", [SignatureTensor("x", "FP32", ())],
                       [SignatureTensor("y", "FP32", ())])
    with pytest.raises(ShoalError, match="the rank of model tensor 'x' is 0"):
        complete_config(ModelConfig(name="m"), scalar, 4)


def test_given_tensors_must_have_the_signatures_rank() -> None:
    config = parse("""
        max_batch_size: 2
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 2 ] } ]
    """)
    with pytest.raises(ShoalError, match="number of dimensions \\(2\\) given for 'x'"):
        complete_config(config, BATCHING, 4)


def test_a_file_that_is_not_a_savedmodel_is_named(tmp_path: pathlib.Path) -> None:
    (tmp_path / "model.savedmodel").mkdir()
    (tmp_path / "model.savedmodel" / "saved_model.pb").write_bytes(b"\x12\x07 not a model")
    with pytest.raises(ShoalError) as info:
        read_signature(str(tmp_path / "model.savedmodel"), "m")
    assert info.value.code == ErrorCode.INVALID_ARG
    assert "model.savedmodel/saved_model.pb cannot be parsed: not a SavedModel" in \
        info.value.message
    (tmp_path / "empty").mkdir()
    with pytest.raises(ShoalError, match=r"no empty/saved_model\.pb"):
        read_signature(str(tmp_path / "empty"), "m")


def test_auto_complete_leaves_graphdef_and_missing_models_alone(tmp_path: pathlib.Path) -> None:
    (tmp_path / "1").mkdir()
    graphdef = ModelConfig(name="m", platform="tensorflow_graphdef")
    assert tensorflow_auto_complete(str(tmp_path), graphdef, 4) is graphdef
    savedmodel = ModelConfig(name="m", platform="tensorflow_savedmodel")
    assert tensorflow_auto_complete(str(tmp_path), savedmodel, 4) is savedmodel


@pytest.mark.parametrize(("config", "made", "platform"), [
    ("", "dir", "tensorflow_savedmodel"),
    ('backend: "tensorflow"', "dir", "tensorflow_savedmodel"),
    ("", "file", ""),  # a model.savedmodel file is not a SavedModel
    ('backend: "tensorflow"\ndefault_model_filename: "model.graphdef"', "none",
     "tensorflow_graphdef"),
])
def test_the_platform_is_inferred_as_triton_does(tmp_path: pathlib.Path, config: str, made: str,
                                                 platform: str) -> None:
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(
        config + '\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]'
                 '\noutput [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    target = model_dir / "1" / "model.savedmodel"
    if made == "dir":
        target.mkdir()
    elif made == "file":
        target.write_bytes(b"x")
    def load() -> Any:
        return load_model_source("m", str(model_dir), str(tmp_path), default_max_batch_size=4,
                                 gpu_count=0, auto_complete=None)

    if not platform:
        with pytest.raises(ShoalError, match="cannot determine the backend"):
            load()
        return
    source = load()
    assert (source.config.platform, source.config.backend) == (platform, "tensorflow")


def test_the_registry_serves_tensorflow_when_installed_and_names_the_extra_when_not(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shoal.workers.backends.tensorflow import runtime

    monkeypatch.setattr(runtime, "tensorflow_installed", lambda: True)
    backend = registry.create_backend("tensorflow", str(tmp_path), str(tmp_path))
    assert type(backend).__name__ == "TensorflowBackend"
    monkeypatch.setattr(runtime, "tensorflow_installed", lambda: False)
    with pytest.raises(ShoalError) as info:
        registry.create_backend("tensorflow", str(tmp_path), str(tmp_path))
    assert info.value.code == ErrorCode.UNSUPPORTED
    assert info.value.message.startswith(
        "backend 'tensorflow' is not installed: install it with pip install "
        "'shoal[tensorflow]'")
    assert "onnxruntime" in info.value.message
