from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from shoal.broker.schedulers.sequence import (
    BoolControl,
    ControlInputs,
    CorridControl,
    InitialStateSpec,
    SequenceBatcherConfig,
    StateSpec,
)
from shoal.errors import ErrorCode, ShoalError


def parse(pbtxt: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(pbtxt, model_config_pb2.ModelConfig())


def from_pbtxt(pbtxt: str) -> SequenceBatcherConfig:
    return SequenceBatcherConfig.from_model_config(parse('name: "m" ' + pbtxt))


def test_reads_a_direct_config_with_every_control_kind() -> None:
    config = from_pbtxt(
        """
        max_batch_size: 8
        sequence_batching {
          max_sequence_idle_microseconds: 5000000
          direct { max_queue_delay_microseconds: 100 minimum_slot_utilization: 0.5 }
          control_input [
            { name: "S" control [{ kind: CONTROL_SEQUENCE_START fp32_false_true: [0, 1] }] },
            { name: "E" control [{ kind: CONTROL_SEQUENCE_END int32_false_true: [5, 7] }] },
            { name: "R" control [{ kind: CONTROL_SEQUENCE_READY bool_false_true: [false, true] }] },
            { name: "C" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING }] }
          ]
        }
        """
    )
    assert config.strategy == "direct"
    assert config.max_sequence_idle_us == 5_000_000
    assert (config.max_queue_delay_us, config.minimum_slot_utilization) == (100, 0.5)
    assert config.controls == ControlInputs(
        start=BoolControl("S", "FP32", 0.0, 1.0),
        end=BoolControl("E", "INT32", 5, 7),
        ready=BoolControl("R", "BOOL", False, True),
        corrid=CorridControl("C", "BYTES"),
    )
    assert config.slots_per_instance == 8


def test_unset_idle_time_is_one_second_and_direct_is_the_default_strategy() -> None:
    config = from_pbtxt("max_batch_size: 0 sequence_batching {}")
    assert config.strategy == "direct"
    assert config.max_sequence_idle_us == 1_000_000
    assert config.slots_per_instance == 1
    assert config.controls == ControlInputs()
    assert not config.batching


def test_reads_an_oldest_config() -> None:
    config = from_pbtxt(
        """
        max_batch_size: 8
        sequence_batching {
          oldest { max_candidate_sequences: 3 preferred_batch_size: [4, 2, 4]
                   max_queue_delay_microseconds: 250 preserve_ordering: true }
        }
        """
    )
    assert config.strategy == "oldest"
    assert config.max_candidate_sequences == 3
    assert config.slots_per_instance == 3
    assert config.preferred_batch_sizes == (2, 4)
    assert config.max_queue_delay_us == 250
    assert config.preserve_ordering


def test_oldest_without_candidate_count_has_max_batch_size_slots() -> None:
    config = from_pbtxt("max_batch_size: 6 sequence_batching { oldest {} }")
    assert config.slots_per_instance == 6


def test_reads_implicit_states_and_their_initial_values() -> None:
    config = from_pbtxt(
        """
        max_batch_size: 2
        sequence_batching {
          state [
            { input_name: "IN0" output_name: "OUT0" data_type: TYPE_INT32 dims: [-1, 3]
              use_same_buffer_for_input_output: true },
            { input_name: "IN1" output_name: "OUT1" data_type: TYPE_FP32 dims: [2]
              initial_state { name: "zeros" data_type: TYPE_FP32 dims: [2] zero_data: true } },
            { input_name: "IN2" output_name: "OUT2" data_type: TYPE_STRING dims: [-1]
              initial_state { name: "f" data_type: TYPE_STRING dims: [4] data_file: "seed.bin" } }
          ]
        }
        """
    )
    assert config.states == (
        StateSpec("IN0", "OUT0", "INT32", (-1, 3), (1, 1, 3), None, single_buffer=True),
        StateSpec("IN1", "OUT1", "FP32", (2,), (1, 2),
                  InitialStateSpec("zeros", "FP32", (1, 2), zero_data=True)),
        StateSpec("IN2", "OUT2", "BYTES", (-1,), (1, 1),
                  InitialStateSpec("f", "BYTES", (1, 4), zero_data=False, data_file="seed.bin")),
    )
    initial = config.states[2].initial
    assert initial is not None and initial.relative_path == "initial_state/seed.bin"
    assert initial.nbytes is None  # BYTES: the file as is
    zeros = config.states[1].initial
    assert zeros is not None and zeros.nbytes == 8 and zeros.relative_path == ""


def test_state_shapes_have_no_batch_dim_without_batching() -> None:
    config = from_pbtxt(
        """
        max_batch_size: 0
        sequence_batching { state { input_name: "I" output_name: "O" data_type: TYPE_FP32
          dims: [3] initial_state { name: "z" data_type: TYPE_FP32 dims: [3] zero_data: true } } }
        """
    )
    state = config.states[0]
    assert state.default_shape == (3,)
    assert state.initial is not None and state.initial.shape == (3,)


_CONTROL = 'control_input { name: "%s" control [{ kind: %s %s }] }'


@pytest.mark.parametrize(
    ("pbtxt", "message"),
    [
        (
            "max_batch_size: 4 sequence_batching { control_input { control "
            "{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] } } }",
            "sequence batching control tensor must have a name for m",
        ),
        (
            "max_batch_size: 4 sequence_batching { "
            + _CONTROL % ("A", "CONTROL_SEQUENCE_START", "int32_false_true: [0, 1]")
            + _CONTROL % ("A", "CONTROL_SEQUENCE_END", "int32_false_true: [0, 1]") + " }",
            "sequence batching control tensor 'A' is specified for multiple control kinds for m",
        ),
        (
            "max_batch_size: 4 sequence_batching { "
            + _CONTROL % ("A", "CONTROL_SEQUENCE_START", "int32_false_true: [0, 1]")
            + _CONTROL % ("B", "CONTROL_SEQUENCE_START", "int32_false_true: [0, 1]") + " }",
            "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m",
        ),
        (
            "max_batch_size: 4 sequence_batching { "
            + _CONTROL % ("A", "CONTROL_SEQUENCE_READY", "") + " }",
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
            "'bool_false_true' for CONTROL_SEQUENCE_READY for m",
        ),
        (
            "max_batch_size: 4 sequence_batching { " + _CONTROL % (
                "A", "CONTROL_SEQUENCE_END", "int32_false_true: [0, 1] fp32_false_true: [0, 1]"
            ) + " }",
            "sequence batching specifies more than one from 'int32_false_true', "
            "'fp32_false_true' and 'bool_false_true' for CONTROL_SEQUENCE_END for m",
        ),
        (
            "max_batch_size: 4 sequence_batching { "
            + _CONTROL % ("A", "CONTROL_SEQUENCE_START", "fp32_false_true: [0, 1, 2]") + " }",
            "sequence batching control 'fp32_false_true' must have exactly 2 entries for "
            "CONTROL_SEQUENCE_START for m",
        ),
        (
            "max_batch_size: 4 sequence_batching { " + _CONTROL % (
                "A", "CONTROL_SEQUENCE_CORRID", "data_type: TYPE_UINT64 int32_false_true: [0, 1]"
            ) + " }",
            "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
            "'bool_false_true' for CONTROL_SEQUENCE_CORRID for m",
        ),
        (
            "max_batch_size: 4 sequence_batching { "
            + _CONTROL % ("A", "CONTROL_SEQUENCE_CORRID", "data_type: TYPE_FP32") + " }",
            "unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types "
            "are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
        ),
        (
            "max_batch_size: 4 sequence_batching { oldest { preferred_batch_size: 0 } }",
            "sequence batching preferred batch size must be positive for m",
        ),
        (
            "max_batch_size: 4 sequence_batching { oldest { preferred_batch_size: 5 } }",
            "sequence batching preferred batch size must be <= max batch size for m",
        ),
        (
            "max_batch_size: 4 sequence_batching { direct { minimum_slot_utilization: 1.5 } }",
            "sequence batching minimum slot utilization must be in range (0.0, 1.0] for m",
        ),
        ("max_batch_size: -1 sequence_batching {}",
         "'max_batch_size' must be non-negative value for m"),
    ],
)
def test_invalid_controls_and_strategies_fail_with_tritons_message(
    pbtxt: str, message: str
) -> None:
    with pytest.raises(ShoalError) as caught:
        from_pbtxt(pbtxt)
    assert (caught.value.code, caught.value.message) == (ErrorCode.INVALID_ARG, message)


_STATE = ('max_batch_size: 4 sequence_batching { state { input_name: "I" output_name: "O" '
          'data_type: TYPE_FP32 dims: [-1, 2] %s } }')


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            'initial_state { name: "a" data_type: TYPE_FP32 dims: [1, 2] zero_data: true } '
            'initial_state { name: "b" data_type: TYPE_FP32 dims: [1, 2] zero_data: true }',
            "initial_state field for state input 'I' must contain exactly one or zero element. "
            "Found '2' elements.",
        ),
        (
            'initial_state { name: "a" data_type: TYPE_INT32 dims: [1, 2] zero_data: true }',
            "The data type used for 'initial_state' field of state 'I' does not match the state "
            "data type.",
        ),
        (
            "initial_state { data_type: TYPE_FP32 dims: [1, 2] zero_data: true }",
            "Field 'name' must be set when using initial_state for state input 'I'.",
        ),
        (
            'initial_state { name: "a" data_type: TYPE_FP32 dims: [2] zero_data: true }',
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions "
            "for state input 'I'. 1 != 2",
        ),
        (
            'initial_state { name: "a" data_type: TYPE_FP32 dims: [-1, 2] zero_data: true }',
            "'initial_state' field for state input name 'I' contains variable dimensions.",
        ),
        (
            'initial_state { name: "a" data_type: TYPE_FP32 dims: [1, 3] zero_data: true }',
            "'initial_state' dim for input name 'I' doesn't match 'state' dim description. "
            "3 != 2",
        ),
        (
            'initial_state { name: "a" data_type: TYPE_FP32 dims: [1, 2] }',
            "initial_state setting expects state'I' to have state_data set",
        ),
        (
            "use_growable_memory: true",
            "In order to 'use_growable_memory', you must also enable 'use_single_buffer' for "
            "state input name 'I'.",
        ),
        (
            'initial_state { name: "a" data_type: TYPE_FP32 dims: [1, 2] '
            'data_file: "../../etc/passwd" }',
            "initial_state data_file for state input 'I' must be a relative path inside "
            "'initial_state/'",
        ),
        (
            'initial_state { name: "a" data_type: TYPE_FP32 dims: [1, 2] data_file: "/etc/x" }',
            "initial_state data_file for state input 'I' must be a relative path inside "
            "'initial_state/'",
        ),
    ],
)
def test_invalid_states_fail_with_tritons_message(extra: str, message: str) -> None:
    with pytest.raises(ShoalError) as caught:
        from_pbtxt(_STATE % extra)
    assert (caught.value.code, caught.value.message) == (ErrorCode.INVALID_ARG, message)


def test_a_state_input_named_twice_is_rejected() -> None:
    state = 'state { input_name: "I" output_name: "%s" data_type: TYPE_FP32 dims: [1] }'
    with pytest.raises(ShoalError, match=r"State input name 'I' specified more than once\."):
        from_pbtxt(f"max_batch_size: 1 sequence_batching {{ {state % 'A'} {state % 'B'} }}")


def test_configs_built_in_code_are_validated_too() -> None:
    with pytest.raises(ShoalError, match="minimum slot utilization"):
        SequenceBatcherConfig(model_name="m", max_batch_size=2, minimum_slot_utilization=-0.1)
    with pytest.raises(ShoalError, match="max_sequence_idle_microseconds must be positive"):
        SequenceBatcherConfig(model_name="m", max_batch_size=2, max_sequence_idle_us=0)
