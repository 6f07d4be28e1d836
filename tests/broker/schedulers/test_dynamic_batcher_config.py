from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from shoal.broker.schedulers.dynamic import DynamicBatcherConfig, QueuePolicy
from shoal.errors import ErrorCode, ShoalError


def parse(pbtxt: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(pbtxt, model_config_pb2.ModelConfig())


def test_reads_every_dynamic_batching_field() -> None:
    config = DynamicBatcherConfig.from_model_config(
        parse(
            """
            name: "m" max_batch_size: 16
            dynamic_batching {
              preferred_batch_size: [8, 4, 8]
              max_queue_delay_microseconds: 500
              priority_levels: 3
              default_priority_level: 2
              default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 100
                                     allow_timeout_override: true max_queue_size: 7 }
              priority_queue_policy { key: 1 value: { max_queue_size: 2 } }
            }
            """
        )
    )
    assert config == DynamicBatcherConfig(
        max_batch_size=16,
        preferred_batch_sizes=(4, 8),
        max_queue_delay_us=500,
        preserve_ordering=False,
        priority_levels=3,
        default_priority_level=2,
        default_policy=QueuePolicy("DELAY", 100, True, 7),
        priority_policies={1: QueuePolicy("REJECT", 0, False, 2)},
        adaptive_delay=True,  # shoal's default (the model parameter shoal_adaptive_queue_delay)
    )


def test_empty_dynamic_batching_gives_triton_defaults() -> None:
    config = DynamicBatcherConfig.from_model_config(
        parse('name: "m" max_batch_size: 4 dynamic_batching { preserve_ordering: true }')
    )
    assert config == DynamicBatcherConfig(max_batch_size=4, preserve_ordering=True,
                                          adaptive_delay=True)
    assert config.default_policy == QueuePolicy("REJECT", 0, False, 0)


@pytest.mark.parametrize(
    ("pbtxt", "message"),
    [
        (
            "max_batch_size: 4 dynamic_batching { preferred_batch_size: 8 }",
            "dynamic batching preferred size must be <= max batch size for m",
        ),
        (
            "max_batch_size: 4 dynamic_batching { preferred_batch_size: 0 }",
            "dynamic batching preferred size must be positive for m",
        ),
        (
            "max_batch_size: 4 dynamic_batching { priority_levels: 2 }",
            "default priority level must be in range [1, 2] for m",
        ),
        (
            "max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 1"
            " priority_queue_policy { key: 3 value: {} } }",
            "priority queue policy must have priority level in range [1, 2] for m",
        ),
        (
            "max_batch_size: 4 dynamic_batching { preserve_ordering: true priority_levels: 2"
            " default_priority_level: 1 }",
            "Only one priority level is allowed when 'preserve_ordering' is true for m",
        ),
        (
            "max_batch_size: 4 dynamic_batching { preserve_ordering: true default_queue_policy"
            " { timeout_action: DELAY default_timeout_microseconds: 10 } }",
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true"
            " for m",
        ),
        ("max_batch_size: -1", "'max_batch_size' must be non-negative value for m"),
    ],
)
def test_invalid_configs_fail_with_tritons_message(pbtxt: str, message: str) -> None:
    with pytest.raises(ShoalError) as caught:
        DynamicBatcherConfig.from_model_config(parse('name: "m" ' + pbtxt))
    assert (caught.value.code, caught.value.message) == (ErrorCode.INVALID_ARG, message)


def test_negative_queue_delay_is_rejected() -> None:
    with pytest.raises(ShoalError, match="max_queue_delay_microseconds"):
        DynamicBatcherConfig(max_batch_size=4, max_queue_delay_us=-1)


def test_preserve_ordering_allows_delay_action_without_a_timeout() -> None:
    config = DynamicBatcherConfig(
        max_batch_size=4, preserve_ordering=True, default_policy=QueuePolicy("DELAY")
    )
    assert config.default_policy.timeout_action == "DELAY"
