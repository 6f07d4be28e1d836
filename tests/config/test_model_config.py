from __future__ import annotations

import json
import textwrap

import pytest
from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc import model_config_pb2 as pb

from shoal.config.model_config import (
    backend_name,
    full_shape,
    instance_names,
    is_decoupled,
    load_config_file,
    normalize_config,
    parse_config_text,
    platform_name,
    tensor_specs,
)
from shoal.config.model_config_json import config_from_json, config_to_json
from shoal.errors import ErrorCode, ShoalError
from shoal.messages import TensorSpec

ADD_SUB = """
name: "add_sub"
backend: "python"
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
instance_group [{ kind: KIND_CPU }]
"""

DYNAMIC = """
name: "mlp"
backend: "pytorch"
max_batch_size: 16
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 8 ] } ]
output [ { name: "y" data_type: TYPE_STRING dims: [ 4 ] } ]
dynamic_batching {
  max_queue_delay_microseconds: 100
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy {
    timeout_action: DELAY default_timeout_microseconds: 5000
    allow_timeout_override: true max_queue_size: 10
  }
  priority_queue_policy { key: 1 value { max_queue_size: 4 } }
}
"""

SEQUENCE = """
name: "acc"
backend: "python"
max_batch_size: 2
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  oldest { max_candidate_sequences: 4 }
}
"""


def normalized(text: str, name: str = "", gpu_count: int = 0) -> pb.ModelConfig:
    config = parse_config_text(text, "m/config.pbtxt")
    model = name or config.name or "m"
    return normalize_config(config, model_name=model, source=f"{model}/config.pbtxt",
                            gpu_count=gpu_count)


def error_of(text: str, name: str = "m", gpu_count: int = 0) -> str:
    with pytest.raises(ShoalError) as info:
        normalized(text, name, gpu_count)
    assert info.value.code == ErrorCode.INVALID_ARG
    return info.value.message


def minimal(body: str, header: str = 'name: "m" backend: "python"') -> str:
    return header + "\n" + textwrap.dedent(body)


# ------------------------------------------------------------------ parsing


def test_parse_add_sub() -> None:
    config = parse_config_text(ADD_SUB, "add_sub/config.pbtxt")
    assert config.name == "add_sub"
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]
    assert list(config.output[1].dims) == [4]
    assert config.instance_group[0].kind == pb.ModelInstanceGroup.KIND_CPU


def test_parse_dynamic_batching_with_priorities_and_queue_policy() -> None:
    config = parse_config_text(DYNAMIC, "mlp/config.pbtxt")
    batching = config.dynamic_batching
    assert batching.priority_levels == 3
    assert batching.default_queue_policy.timeout_action == pb.ModelQueuePolicy.DELAY
    assert batching.priority_queue_policy[1].max_queue_size == 4


def test_syntax_error_names_file_and_line() -> None:
    text = 'name: "mlp"\nmax_batch_size: 4\ninput [ { name: "x" dims: [ 1 }\n'
    with pytest.raises(ShoalError) as info:
        parse_config_text(text, "mlp/config.pbtxt")
    assert info.value.code == ErrorCode.INVALID_ARG
    assert info.value.message.startswith("mlp/config.pbtxt: line 3 ")


def test_unknown_field_is_named() -> None:
    with pytest.raises(ShoalError) as info:
        parse_config_text('name: "m"\nmax_batch: 4\n', "m/config.pbtxt")
    assert "line 2" in info.value.message
    assert "max_batch" in info.value.message


@pytest.mark.parametrize("value", ["9223372036854775807", "-2147483649", "4294967296"])
def test_enum_number_beyond_int32_is_a_parse_error(value: str) -> None:
    """Found by fuzzing (atheris): protobuf's text parser raised ValueError ('Value out of
    range'), not ParseError, for an enum number that does not fit int32."""
    text = f'name: "m" backend: "python" instance_group [ {{ kind: {value} }} ]'
    with pytest.raises(ShoalError) as info:
        parse_config_text(text, "m/config.pbtxt")
    assert info.value.code is ErrorCode.INVALID_ARG
    assert info.value.message.startswith("m/config.pbtxt: ")
    assert "out of range" in info.value.message


def test_load_config_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert load_config_file(str(tmp_path / "missing" / "config.pbtxt")) is None
    model_dir = tmp_path / "add_sub"
    model_dir.mkdir()
    (model_dir / "config.pbtxt").write_text(ADD_SUB)
    config = load_config_file(str(model_dir / "config.pbtxt"))
    assert config is not None and config.backend == "python"
    (model_dir / "config.pbtxt").write_text("name: ")
    with pytest.raises(ShoalError) as info:
        load_config_file(str(model_dir / "config.pbtxt"))
    assert info.value.message.startswith("add_sub/config.pbtxt: ")
    assert str(tmp_path) not in info.value.message


def test_config_from_json_load_api_form() -> None:
    config = config_from_json(json.dumps({
        "name": "m", "backend": "python", "max_batch_size": 8,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [3, -1]}],
        "instance_group": [{"kind": "KIND_CPU", "count": 2}],
    }).encode())
    assert list(config.input[0].dims) == [3, -1]
    assert config.instance_group[0].count == 2


@pytest.mark.parametrize(
    "text", ['{"name": "m", "bogus": 1}', "{not json", '{"max_batch_size": "x"}'])
def test_config_from_json_rejects_bad_input(text: str) -> None:
    with pytest.raises(ShoalError) as info:
        config_from_json(text)
    assert info.value.code == ErrorCode.INVALID_ARG


# ------------------------------------------------------------------ normalization defaults


def test_add_sub_normalized_defaults() -> None:
    original = parse_config_text(ADD_SUB, "add_sub/config.pbtxt")
    config = normalize_config(original, model_name="add_sub", source="add_sub/config.pbtxt")
    assert config.version_policy.latest.num_versions == 1
    group = config.instance_group[0]
    assert (group.name, group.kind, group.count) == ("add_sub_0", pb.ModelInstanceGroup.KIND_CPU, 1)
    assert config.optimization.input_pinned_memory.enable
    assert config.optimization.output_pinned_memory.enable
    assert config.default_model_filename == "model.py"
    assert not original.HasField("version_policy")  # input not modified


def test_name_filled_from_directory() -> None:
    config = normalized('backend: "python"', name="noname")
    assert config.name == "noname"
    assert config.instance_group[0].name == "noname"


def test_dynamic_batching_preferred_defaults_to_max_batch_size() -> None:
    config = normalized(DYNAMIC)
    assert list(config.dynamic_batching.preferred_batch_size) == [16]
    assert config.dynamic_batching.default_priority_level == 2
    assert config.platform == "pytorch_libtorch"


def test_dynamic_batching_with_max_batch_size_zero_keeps_queueing() -> None:
    config = normalized(minimal("dynamic_batching { max_queue_delay_microseconds: 5 }"))
    assert config.HasField("dynamic_batching")
    assert list(config.dynamic_batching.preferred_batch_size) == []
    message = error_of(minimal("dynamic_batching { preferred_batch_size: [ 1 ] }"))
    assert "dynamic_batching.preferred_batch_size[0]: 1 exceeds max_batch_size 0" in message


def test_sequence_batching_defaults() -> None:
    config = normalized(SEQUENCE)
    assert config.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    assert list(config.sequence_batching.oldest.preferred_batch_size) == [2]


def test_explicit_values_are_kept() -> None:
    config = normalized(minimal("""
        max_batch_size: 8
        version_policy { specific { versions: [ 1, 3 ] } }
        sequence_batching { max_sequence_idle_microseconds: 7 }
        optimization { input_pinned_memory { enable: false } }
    """))
    assert list(config.version_policy.specific.versions) == [1, 3]
    assert config.sequence_batching.max_sequence_idle_microseconds == 7
    assert not config.optimization.input_pinned_memory.enable


def test_instance_group_default_cpu() -> None:
    config = normalized(minimal(""))
    [group] = config.instance_group
    assert (group.name, group.kind, group.count, list(group.gpus)) == (
        "m", pb.ModelInstanceGroup.KIND_CPU, 1, [])


def test_instance_group_default_gpu_one_per_device() -> None:
    [group] = normalized(minimal(""), gpu_count=2).instance_group
    assert (group.name, group.kind, group.count, list(group.gpus)) == (
        "m", pb.ModelInstanceGroup.KIND_GPU, 1, [0, 1])


def test_onnxruntime_cpu_default_count_is_two() -> None:
    [group] = normalized(minimal("", header='name: "m" backend: "onnxruntime"')).instance_group
    assert group.count == 2


def test_unnamed_groups_and_kind_auto() -> None:
    config = normalized(minimal("""
        instance_group [
          { count: 3 },
          { name: "mine" kind: KIND_AUTO gpus: [ 1 ] },
          { kind: KIND_GPU }
        ]
    """), gpu_count=2)
    names = [g.name for g in config.instance_group]
    assert names == ["m_0", "mine", "m_2"]
    first, second, third = config.instance_group
    assert (first.kind, first.count) == (pb.ModelInstanceGroup.KIND_GPU, 3)
    assert (second.kind, list(second.gpus)) == (pb.ModelInstanceGroup.KIND_GPU, [1])
    assert list(third.gpus) == [0, 1]


def test_kind_auto_without_gpu_is_cpu() -> None:
    [group] = normalized(minimal("instance_group [ { kind: KIND_AUTO } ]")).instance_group
    assert group.kind == pb.ModelInstanceGroup.KIND_CPU


@pytest.mark.parametrize(("body", "gpus", "expected"), [
    ("instance_group [ { kind: KIND_GPU gpus: [ 2 ] } ]", 2, "instance_group[0].gpus: GPU id 2"),
    ("instance_group [ { kind: KIND_GPU } ]", 0, "instance_group[0].kind: KIND_GPU but no GPUs"),
    ("instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]", 1, "must be empty for KIND_CPU"),
    # KIND_AUTO with an absent GPU falls back to CPU, which then must not list GPUs (as Triton)
    ("instance_group [ { kind: KIND_AUTO gpus: [ 5 ] } ]", 1, "must be empty for KIND_CPU"),
])
def test_instance_group_errors(body: str, gpus: int, expected: str) -> None:
    assert expected in error_of(minimal(body), gpu_count=gpus)


@pytest.mark.parametrize(("body", "gpus", "expected"), [
    ("instance_group [ { count: 2147483647 kind: KIND_CPU } ]", 0,
     "instance_group[0].count: the model would have 2147483647 instances; at most 1024"),
    ("instance_group [ { count: 600 kind: KIND_GPU gpus: [ 0, 1 ] } ]", 2,
     "instance_group[0].count: the model would have 1200 instances"),
    ("instance_group [ { count: 1000 kind: KIND_CPU }, { count: 25 kind: KIND_CPU } ]", 0,
     "instance_group[1].count: the model would have 1025 instances"),
])
def test_instance_count_is_bounded(body: str, gpus: int, expected: str) -> None:
    """Found by fuzzing: ``count: 2147483647`` passed, and the broker's loop then built a slot
    per instance (about 40 minutes and 200 GB before spawning anything)."""
    assert expected in error_of(minimal(body), gpu_count=gpus)


def test_instance_count_at_the_bound_is_accepted() -> None:
    config = normalized(minimal("instance_group [ { count: 512 kind: KIND_GPU gpus: [ 0, 1 ] } ]"),
                        gpu_count=2)
    assert len(instance_names(config)) == 1024


# ------------------------------------------------------------------ validation errors


@pytest.mark.parametrize(("body", "expected"), [
    ('input [ { name: "x" data_type: TYPE_FP32 } ]',
     "m/config.pbtxt: input[0].dims: must not be empty"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 0 ] } ]',
     "input[0].dims[1]: 0 is not allowed"),
    ('output [ { name: "y" data_type: TYPE_FP32 dims: [ -2 ] } ]',
     "output[0].dims[0]: -2 is not allowed"),
    ('input [ { name: "x" dims: [ 1 ] } ]', "input[0].data_type:"),
    ('input [ { data_type: TYPE_FP32 dims: [ 1 ] } ]', "input[0].name: must specify 'name'"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] }, '
     '{ name: "x" data_type: TYPE_INT32 dims: [ 1 ] } ]',
     "input[1].name: duplicate input name 'x'"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 3 ] reshape { shape: [ 5 ] } } ]',
     "input[0].reshape: 'x' has a different size"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } } ]',
     "input[0].reshape: cannot be empty for a non-batching model"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, -1 ] reshape { shape: [ -1, 2 ] } } ]',
     "input[0].reshape: 'x' dims and reshape differ"),
    ("max_batch_size: -1", "max_batch_size: must be >= 0"),
    ("max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 2, 8 ] }",
     "dynamic_batching.preferred_batch_size[1]: 8 exceeds max_batch_size 4"),
    ("max_batch_size: 4 dynamic_batching { priority_levels: 2 }",
     "dynamic_batching.default_priority_level: must be in range [1, 2], got 0"),
    ("max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
     "dynamic_batching.default_priority_level: must be in range [1, 2], got 3"),
    ("dynamic_batching { priority_levels: 2 default_priority_level: 1 "
     "priority_queue_policy { key: 3 value { } } }",
     "dynamic_batching.priority_queue_policy[3]: priority level must be in range [1, 2]"),
    ("dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }",
     "only one priority level is allowed"),
    ("sequence_batching { control_input [ "
     "{ name: \"A\" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }, "
     "{ name: \"B\" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] }",
     "control_input[1].control[0].kind: CONTROL_SEQUENCE_START is specified twice"),
    ("sequence_batching { control_input [ "
     "{ name: \"C\" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ] }",
     "control_input[0].control[0].data_type: CONTROL_SEQUENCE_CORRID must be TYPE_UINT64"),
    ("sequence_batching { control_input [ "
     "{ name: \"S\" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 1 ] } ] } ] }",
     "int32_false_true: must have exactly 2 entries"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ] batch_input [ { kind: '
     'BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_INT32 source_input: "z" } ]',
     "batch_input[0].source_input: unknown input 'z'"),
    ("model_transaction_policy { decoupled: true } response_cache { enable: true }",
     "response_cache.enable: the response cache does not support decoupled models"),
])
def test_validation_errors(body: str, expected: str) -> None:
    assert expected in error_of(minimal(body))


@pytest.mark.parametrize(("body", "expected"), [
    ("sequence_batching { control_input [ "
     "{ name: \"S\" control [ { kind: 77 int32_false_true: [ 0, 1 ] } ] } ] }",
     "sequence_batching.control_input[0].control[0].kind: 77 is not a value of Kind"),
    ('input [ { name: "x" data_type: -1 dims: [ 1 ] } ]',
     "input[0].data_type: -1 is not a value of DataType"),
    ('sequence_batching { state [ { input_name: "i" output_name: "o" data_type: 99 '
     "dims: [ 1 ] } ] }", "sequence_batching.state[0].data_type: 99 is not a value of DataType"),
    ('batch_input [ { kind: 42 target_name: "n" data_type: TYPE_INT32 source_input: "x" } ]',
     "batch_input[0].kind: 42 is not a value of Kind"),
    ("dynamic_batching { priority_levels: 1 default_priority_level: 1 priority_queue_policy "
     "{ key: 1 value { timeout_action: 5 } } }",
     "dynamic_batching.priority_queue_policy[1].timeout_action: 5 is not a value of "
     "TimeoutAction"),
    ("instance_group [ { kind: 9 } ]", "instance_group[0].kind: 9 is not a value of Kind"),
])
def test_enum_numbers_that_name_no_value_are_refused(body: str, expected: str) -> None:
    """Found by fuzzing: the enums are open (proto3), so ``kind: 77`` parses; looking its name
    up later (sequence controls here, the scheduler and workers after) raised ValueError."""
    assert expected in error_of(minimal(body))


def test_name_mismatch_is_an_error() -> None:
    message = error_of(ADD_SUB, name="other")
    assert message.startswith("other/config.pbtxt: name: 'add_sub' does not match")


def test_backend_must_be_known() -> None:
    assert "backend: must specify 'backend'" in error_of('name: "m"')
    assert "platform: 'onnxruntime_onnx' does not match backend 'pytorch'" in error_of(
        'name: "m" backend: "pytorch" platform: "onnxruntime_onnx"')


def test_reshape_valid_forms() -> None:
    config = normalized(minimal("""
        max_batch_size: 4
        input [ { name: "a" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } },
                { name: "b" data_type: TYPE_FP32 dims: [ 2, 4, -1, 6 ]
                  reshape { shape: [ 8, -1, 1, 6 ] } } ]
    """))
    assert list(config.input[1].reshape.shape) == [8, -1, 1, 6]


ENSEMBLE = """
name: "ens"
platform: "ensemble"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "a" model_version: -1
    input_map { key: "X" value: "IN" } output_map { key: "Y" value: "mid" } },
  { model_name: "b" model_version: -1
    input_map { key: "X" value: "mid" } output_map { key: "Y" value: "OUT" } }
] }
"""


def test_ensemble_is_valid_and_gets_no_instance_group() -> None:
    config = normalized(ENSEMBLE)
    assert len(config.instance_group) == 0
    assert not config.HasField("optimization")
    assert backend_name(config) == "" and platform_name(config) == "ensemble"


def test_ensemble_errors() -> None:
    unwritten = ENSEMBLE.replace('value: "OUT"', 'value: "other"')
    assert "output[0]: ensemble output 'OUT' is not written" in error_of(unwritten, name="ens")
    unused = ENSEMBLE.replace('value: "IN"', 'value: "mid"')
    assert "input[0]: ensemble input 'IN' is not used" in error_of(unused, name="ens")
    with_group = ENSEMBLE + "instance_group [ { kind: KIND_CPU } ]"
    assert "instance_group: must not be specified for an ensemble" in error_of(with_group, "ens")


# ------------------------------------------------------------------ JSON


def test_config_to_json_numbers_defaults_and_enums() -> None:
    doc = config_to_json(normalized(DYNAMIC))
    assert doc["input"][0]["dims"] == [-1, 8]  # type: ignore[index]
    assert doc["input"][0]["data_type"] == "TYPE_FP32"  # type: ignore[index]
    assert doc["input"][0]["optional"] is False  # type: ignore[index]
    assert doc["output"][0]["data_type"] == "TYPE_STRING"  # type: ignore[index]
    batching = doc["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 100  # type: ignore[index]
    assert batching["priority_levels"] == 3  # type: ignore[index]
    assert batching["default_priority_level"] == 2  # type: ignore[index]
    assert batching["preferred_batch_size"] == [16]  # type: ignore[index]
    policy = batching["default_queue_policy"]  # type: ignore[index]
    assert policy == {"timeout_action": "DELAY", "default_timeout_microseconds": 5000,
                      "allow_timeout_override": True, "max_queue_size": 10}
    assert batching["priority_queue_policy"]["1"]["default_timeout_microseconds"] == 0  # type: ignore[index]
    assert doc["instance_group"][0]["kind"] == "KIND_CPU"  # type: ignore[index]
    assert doc["version_policy"] == {"latest": {"num_versions": 1}}
    assert doc["max_batch_size"] == 16 and doc["runtime"] == "" and doc["batch_input"] == []
    assert list(doc)[:6] == ["name", "platform", "backend", "runtime", "version_policy",
                             "max_batch_size"]


def test_config_to_json_sequence_and_specific_versions() -> None:
    config = normalized(SEQUENCE.replace('backend: "python"', 'backend: "python" '
                                         'version_policy { specific { versions: [ 2 ] } }'))
    doc = config_to_json(config)
    assert doc["sequence_batching"]["max_sequence_idle_microseconds"] == 1_000_000  # type: ignore[index]
    assert doc["sequence_batching"]["oldest"]["max_queue_delay_microseconds"] == 0  # type: ignore[index]
    assert doc["version_policy"] == {"specific": {"versions": [2]}}


def test_config_json_round_trip() -> None:
    config = normalized(DYNAMIC)
    assert config_from_json(json.dumps(config_to_json(config))) == config
    assert config_to_json(pb.ModelConfig()) == {}


def _int64_paths(descriptor: object, prefix: str, seen: frozenset[str]) -> set[str]:
    paths: set[str] = set()
    wide = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
            FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}
    for field in descriptor.fields:  # type: ignore[attr-defined]
        path = f"{prefix}::{field.name}"
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.full_name not in seen:
                paths |= _int64_paths(field.message_type, path,
                                      seen | {field.message_type.full_name})
        elif field.type in wide:
            paths.add(path)
    return paths


def test_int64_field_list_matches_triton() -> None:
    """Same guard as Triton's ValidateModelConfigInt64: a new 64-bit field in model_config.proto
    must be reviewed in config_to_json."""
    assert _int64_paths(pb.ModelConfig.DESCRIPTOR, "ModelConfig", frozenset()) == {
        "ModelConfig::input::dims", "ModelConfig::input::reshape::shape",
        "ModelConfig::output::dims", "ModelConfig::output::reshape::shape",
        "ModelConfig::version_policy::specific::versions",
        "ModelConfig::dynamic_batching::max_queue_delay_microseconds",
        "ModelConfig::dynamic_batching::default_queue_policy::default_timeout_microseconds",
        "ModelConfig::dynamic_batching::priority_queue_policy::value::default_timeout_microseconds",
        "ModelConfig::dynamic_batching::priority_levels",
        "ModelConfig::dynamic_batching::priority_queue_policy::key",
        "ModelConfig::dynamic_batching::default_priority_level",
        "ModelConfig::sequence_batching::direct::max_queue_delay_microseconds",
        "ModelConfig::sequence_batching::state::dims",
        "ModelConfig::sequence_batching::state::initial_state::dims",
        "ModelConfig::sequence_batching::oldest::max_queue_delay_microseconds",
        "ModelConfig::sequence_batching::max_sequence_idle_microseconds",
        "ModelConfig::ensemble_scheduling::step::model_version",
        "ModelConfig::model_warmup::inputs::value::dims",
        "ModelConfig::optimization::cuda::graph_spec::input::value::dim",
        "ModelConfig::optimization::cuda::graph_spec::graph_lower_bound::input::value::dim",
        "ModelConfig::instance_group::secondary_devices::device_id",
    }


def test_config_to_json_other_int64_fields() -> None:
    config = parse_config_text("""
        name: "e" platform: "ensemble"
        ensemble_scheduling { step [ { model_name: "a" model_version: 3 } ] }
        model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value { dims: [ 2, 2 ] } } } ]
    """, "e/config.pbtxt")
    doc = config_to_json(config)
    assert doc["ensemble_scheduling"]["step"][0]["model_version"] == 3  # type: ignore[index]
    assert doc["model_warmup"][0]["inputs"]["x"]["dims"] == [2, 2]  # type: ignore[index]
    state_config = parse_config_text(
        'sequence_batching { state [ { input_name: "i" dims: [ 5 ] '
        'initial_state [ { dims: [ 5 ] } ] } ] }', "s/config.pbtxt")
    state = config_to_json(state_config)["sequence_batching"]["state"][0]  # type: ignore[index]
    assert state["dims"] == [5]
    assert state["initial_state"][0]["dims"] == ["5"]  # left as Triton leaves it


# ------------------------------------------------------------------ queries


def test_instance_name_expansion() -> None:
    config = normalized(minimal("""
        instance_group [
          { name: "cpu" kind: KIND_CPU count: 2 },
          { kind: KIND_GPU count: 2 gpus: [ 0, 1 ] },
          { name: "one" kind: KIND_MODEL }
        ]
    """), gpu_count=2)
    assert instance_names(config) == [
        ("cpu_0", "CPU", 0, 0), ("cpu_1", "CPU", 0, 0),
        ("m_1_0", "GPU", 0, 1), ("m_1_0", "GPU", 1, 1),
        ("m_1_1", "GPU", 0, 1), ("m_1_1", "GPU", 1, 1),
        ("one_0", "MODEL", 0, 2),
    ]


def test_instance_names_require_resolved_kind() -> None:
    config = pb.ModelConfig(name="m")
    config.instance_group.add(name="g", count=1)
    with pytest.raises(ShoalError):
        instance_names(config)


def test_tensor_specs() -> None:
    config = normalized(minimal("""
        max_batch_size: 2
        input [ { name: "a" data_type: TYPE_STRING dims: [ 1 ] reshape { shape: [ ] }
                  optional: true },
                { name: "b" data_type: TYPE_BF16 dims: [ -1, 3 ] } ]
        output [ { name: "c" data_type: TYPE_BOOL dims: [ 3 ] } ]
    """))
    inputs, outputs = tensor_specs(config)
    assert inputs == [TensorSpec("a", "BYTES", [1], optional=True, reshape=[]),
                      TensorSpec("b", "BF16", [-1, 3])]
    assert outputs == [TensorSpec("c", "BOOL", [3])]


def test_full_shape() -> None:
    assert full_shape([3, 4], 8) == [-1, 3, 4]
    assert full_shape([3, 4], 0) == [3, 4]


def test_backend_and_platform_names() -> None:
    assert backend_name(pb.ModelConfig(platform="pytorch_libtorch")) == "pytorch"
    assert backend_name(pb.ModelConfig(platform="onnxruntime_onnx")) == "onnxruntime"
    assert backend_name(pb.ModelConfig(platform="tensorrt_plan")) == "tensorrt"
    assert backend_name(pb.ModelConfig(platform="tensorflow_savedmodel")) == "tensorflow"
    assert backend_name(pb.ModelConfig(platform="mystery")) == ""
    assert backend_name(pb.ModelConfig(backend="python", platform="x")) == "python"
    assert platform_name(pb.ModelConfig(backend="python")) == "python"
    assert platform_name(pb.ModelConfig(backend="pytorch", platform="pytorch_libtorch")) == \
        "pytorch_libtorch"


def test_is_decoupled() -> None:
    assert not is_decoupled(normalized(ADD_SUB))
    assert is_decoupled(normalized(minimal("model_transaction_policy { decoupled: true }")))
