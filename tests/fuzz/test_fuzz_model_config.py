"""Fuzzing config.pbtxt handling (``model_config.py`` parse / normalize and the queries the broker
runs on a normalized config, ``model_config_checks.py``): any text, any bytes in the file, and
any ModelConfig (random fields, enum numbers without a name, extreme integers) gives a config or
a client error, and the queries on an accepted config finish."""

from __future__ import annotations

import os
import tempfile
from typing import Final

from google.protobuf import text_format
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as pb

from shoal.broker.schedulers.dynamic import DynamicBatcherConfig
from shoal.config.model_config import (
    config_to_json,
    full_shape,
    instance_names,
    is_decoupled,
    load_config_file,
    normalize_config,
    parse_config_text,
    tensor_specs,
)
from shoal.config.sequence_batching import SequenceBatcherConfig
from shoal.errors import ErrorCode
from tests.fuzz.strategies import NAMES, messages, mutated_messages
from tests.fuzz.support import check_client_outcome, examples

SOURCE: Final = "m/config.pbtxt"
# configs from tests/config/test_model_config.py and the example repository, the mutation seeds
SEEDS: Final = (
    'name: "m" backend: "python" max_batch_size: 8 input [{ name: "INPUT0" data_type: TYPE_FP32 '
    'dims: [ -1 ] }] output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }] '
    "dynamic_batching { preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 100 "
    "priority_levels: 2 default_priority_level: 1 }",
    'name: "m" backend: "python" sequence_batching { control_input [{ name: "START" control '
    "[{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }] }] oldest { "
    "max_candidate_sequences: 4 } state [{ input_name: \"IN\" output_name: \"OUT\" "
    "data_type: TYPE_INT32 dims: [ 1 ] }] }",
    'name: "m" platform: "ensemble" input [{ name: "a" data_type: TYPE_FP32 dims: [ 1 ] }] '
    'output [{ name: "b" data_type: TYPE_FP32 dims: [ 1 ] }] ensemble_scheduling { step [{ '
    'model_name: "x" model_version: -1 input_map { key: "IN" value: "a" } output_map { '
    'key: "OUT" value: "b" } }] }',
    'name: "m" backend: "onnxruntime" instance_group [{ count: 2 kind: KIND_GPU gpus: [ 0 ] }] '
    'max_batch_size: 4 model_warmup [{ name: "w" batch_size: 1 inputs { key: "a" value { '
    'data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } }] input [{ name: "a" '
    'data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } }]',
)
OVERRIDES: Final = {
    "name": lambda field: st.sampled_from(NAMES),
    "backend": lambda field: st.sampled_from(("python", "pytorch", "onnxruntime", "tensorrt",
                                              "tensorflow", "", "x")),
    "platform": lambda field: st.sampled_from(("", "ensemble", "tensorrt_plan",
                                               "pytorch_libtorch", "tensorflow_savedmodel",
                                               "x")),
    "max_batch_size": lambda field: st.sampled_from((0, 1, 4, 8, -1, 2**31 - 1)),
    "dims": lambda field: st.sampled_from((-1, 0, 1, 2, 3, -2, 2**62)),
    "shape": lambda field: st.sampled_from((-1, 0, 1, 2, 3, -2)),
    "input_map": lambda field: st.sampled_from(NAMES),
    "output_map": lambda field: st.sampled_from(NAMES),
    "inputs": lambda field: st.sampled_from(NAMES),
    "model_name": lambda field: st.sampled_from(NAMES),
    "input_name": lambda field: st.sampled_from(NAMES),
    "output_name": lambda field: st.sampled_from(NAMES),
    "source_input": lambda field: st.sampled_from(NAMES),
    "target_name": lambda field: st.sampled_from(NAMES),
}
configs = messages(pb.ModelConfig, OVERRIDES)
_TOKENS: Final = ("{", "}", "[", "]", ":", '"', "\\", "\n", "#", "-", "0x", "1e999", "nan",
                  "99999999999999999999999", "KIND_GPU", "TYPE_STRING", "data_type: 77",
                  "kind: 42", "kind: 9223372036854775807", "input {", "\x00", "\ud800", "é")


def accept(text: str, gpu_count: int) -> None:
    """What the broker does with a config.pbtxt text (short of the model files): parse,
    normalize, and read the normalized config as ``build_runtime`` does. UNSUPPORTED (a feature
    shoal lacks, e.g. ``iterative_sequence``: Triton's code too) is a fine answer here."""
    def run() -> None:
        config = normalize_config(parse_config_text(text, SOURCE), model_name="m",
                                  source=SOURCE, gpu_count=gpu_count)
        read_normalized(config)

    check_client_outcome(run, also=frozenset({ErrorCode.UNSUPPORTED}))


def read_normalized(config: pb.ModelConfig) -> None:
    inputs, outputs = tensor_specs(config)
    for spec in (*inputs, *outputs):
        full_shape(spec.dims, config.max_batch_size)
    instance_names(config)
    is_decoupled(config)
    config_to_json(config)
    if config.max_batch_size > 0 and config.HasField("dynamic_batching"):
        DynamicBatcherConfig.from_model_config(config)
    if config.HasField("sequence_batching"):
        SequenceBatcherConfig.from_model_config(config)


@examples(300)
@given(config=configs, gpu_count=st.integers(0, 2))
def test_any_model_config(config: pb.ModelConfig, gpu_count: int) -> None:
    accept(text_format.MessageToString(config), gpu_count)


@examples(800)
@given(seed=st.sampled_from(SEEDS), data=st.data(), gpu_count=st.integers(0, 2))
def test_valid_configs_with_random_leaves(seed: str, data: st.DataObject, gpu_count: int) -> None:
    config = data.draw(mutated_messages(parse_config_text(seed, SOURCE), OVERRIDES))
    accept(text_format.MessageToString(config), gpu_count)


@examples(200)
@given(seed=st.sampled_from(SEEDS), data=st.data(), gpu_count=st.integers(0, 2))
def test_mutated_config_text(seed: str, data: st.DataObject, gpu_count: int) -> None:
    text = seed
    for _ in range(data.draw(st.integers(1, 4))):
        where = data.draw(st.integers(0, len(text)))
        if data.draw(st.booleans()):
            text = text[:where] + data.draw(st.one_of(st.sampled_from(_TOKENS),
                                                      st.text(max_size=4))) + text[where:]
        else:
            text = text[:where] + text[where + data.draw(st.integers(1, 8)):]
    # the text of a file that is UTF-8 (load_config_file refuses others): no lone surrogates
    accept(text.encode("utf-8", "replace").decode("utf-8"), gpu_count)


@examples(100)
@given(content=st.one_of(st.binary(max_size=64),
                         st.sampled_from(SEEDS).map(lambda s: s.encode() + b"\xff\xfe")))
def test_config_file_of_any_bytes(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "config.pbtxt")
        with open(path, "wb") as file:
            file.write(content)
        check_client_outcome(lambda: load_config_file(path, source=SOURCE))
