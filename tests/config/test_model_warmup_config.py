"""``model_warmup`` is checked with the rest of the config (shoal.config.model_config_checks)."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as pb

from shoal.config.model_config import normalize_config, parse_config_text
from shoal.errors import ErrorCode, ShoalError

MODEL = """
name: "m" backend: "python" max_batch_size: 4
input [
  { name: "X" data_type: TYPE_FP32 dims: [ -1, 3 ] },
  { name: "OPT" data_type: TYPE_INT32 dims: [ 1 ] optional: true }
]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]
sequence_batching { control_input [ { name: "START" control [
  { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] }
"""

X_ZEROS = 'inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 2, 3 ] zero_data: true } }'


def normalized(sample: str) -> pb.ModelConfig:
    text = MODEL + f"model_warmup [ {{ name: \"w\" {sample} }} ]"
    config = parse_config_text(text, "m/config.pbtxt")
    return normalize_config(config, model_name="m", source="m/config.pbtxt")


def error_of(sample: str) -> str:
    with pytest.raises(ShoalError) as info:
        normalized(sample)
    assert info.value.code == ErrorCode.INVALID_ARG
    return info.value.message


@pytest.mark.parametrize("sample", [
    f"batch_size: 1 {X_ZEROS}",
    f"batch_size: 4 count: 9 {X_ZEROS}",
    'batch_size: 1 inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 1, 3 ] '
    'random_data: true } } inputs { key: "START" value { data_type: TYPE_INT32 dims: [ 1 ] '
    "zero_data: true } }",
    'batch_size: 2 inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 5, 3 ] '
    'input_data_file: "sub/x.bin" } }',
])
def test_valid_samples(sample: str) -> None:
    assert len(normalized(sample).model_warmup) == 1


@pytest.mark.parametrize(("sample", "expected"), [
    (X_ZEROS, "model_warmup[0].batch_size: must be >= 1"),
    (f"batch_size: 5 {X_ZEROS}", "model_warmup[0].batch_size: 5 exceeds max_batch_size 4"),
    (f'batch_size: 1 {X_ZEROS} inputs {{ key: "Q" value {{ data_type: TYPE_FP32 dims: [ 1 ] '
     "zero_data: true } }", "model_warmup[0].inputs['Q']: unknown input 'Q'"),
    ('batch_size: 1 inputs { key: "OPT" value { data_type: TYPE_INT32 dims: [ 1 ] '
     "zero_data: true } }", "model_warmup[0].inputs: missing input 'X'"),
    ('batch_size: 1 inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 2, 3 ] } }',
     "model_warmup[0].inputs['X']: must specify one of 'zero_data', 'random_data' or "
     "'input_data_file'"),
    ('batch_size: 1 inputs { key: "X" value { dims: [ 2, 3 ] zero_data: true } }',
     "model_warmup[0].inputs['X'].data_type: must specify a valid 'data_type'"),
    ('batch_size: 1 inputs { key: "X" value { data_type: TYPE_FP16 dims: [ 2, 3 ] '
     "zero_data: true } }",
     "model_warmup[0].inputs['X'].data_type: TYPE_FP16 does not match the input's TYPE_FP32"),
    ('batch_size: 1 inputs { key: "X" value { data_type: TYPE_FP32 dims: [ -1, 3 ] '
     "zero_data: true } }",
     "model_warmup[0].inputs['X'].dims[0]: -1 is not allowed: warmup expects every "
     "variable-size dimension to be specified"),
    ('batch_size: 1 inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 2, 4 ] '
     "zero_data: true } }",
     "model_warmup[0].inputs['X'].dims: [2, 4] does not match the input's dims [-1, 3]"),
    ('batch_size: 1 inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 3 ] '
     "zero_data: true } }", "does not match the input's dims [-1, 3]"),
    ('batch_size: 1 inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 2, 3 ] '
     'input_data_file: "../../etc/passwd" } }',
     "model_warmup[0].inputs['X'].input_data_file: input_data_file '../../etc/passwd' must be "
     "a relative path to a file inside the model's 'warmup/' folder"),
    ('batch_size: 1 inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 2, 3 ] '
     'input_data_file: "/abs.bin" } }', "must be a relative path"),
])
def test_invalid_samples_name_the_field(sample: str, expected: str) -> None:
    message = error_of(sample)
    assert message.startswith("m/config.pbtxt: ")
    assert expected in message


def test_non_batching_model_takes_any_batch_size() -> None:
    """As Triton: a sample of batch_size N runs N requests of shape dims in one execution."""
    text = ('name: "m" backend: "python" '
            'input [ { name: "X" data_type: TYPE_STRING dims: [ 2 ] } ] '
            'output [ { name: "Y" data_type: TYPE_STRING dims: [ 2 ] } ] '
            'model_warmup [ { name: "w" batch_size: 3 inputs { key: "X" value { '
            "data_type: TYPE_STRING dims: [ 2 ] random_data: true } } } ]")
    config = normalize_config(parse_config_text(text, "m/config.pbtxt"), model_name="m",
                              source="m/config.pbtxt")
    assert config.model_warmup[0].batch_size == 3


def test_ensembles_still_refuse_warmup() -> None:
    text = ('name: "e" platform: "ensemble" '
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ] '
            'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ] '
            'ensemble_scheduling { step [ { model_name: "a" input_map { key: "i" value: "X" } '
            'output_map { key: "o" value: "Y" } } ] } '
            'model_warmup [ { name: "w" batch_size: 1 } ]')
    with pytest.raises(ShoalError, match="model_warmup: must not be specified for an ensemble"):
        normalize_config(parse_config_text(text, "e/config.pbtxt"), model_name="e",
                         source="e/config.pbtxt")
