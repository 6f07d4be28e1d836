"""The iterative-sequence scheduler: an instance's rescheduled requests go first into its next
batch, new requests fill it up to max_batch_size rows (same shape signature), and what waits for
a dead instance comes back to the broker."""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from shoal.broker.model_runtime import check_iterative
from shoal.broker.schedulers.base import QueuedRequest
from shoal.broker.schedulers.iterative import IterativeScheduler
from shoal.errors import ErrorCode, ShoalError


def request(n: int, rows: int = 1, signature: Hashable = ()) -> QueuedRequest:
    return QueuedRequest((b"f", n), rows, float(n), shape_signature=signature)


def keys(batch: list[QueuedRequest] | None) -> list[int]:
    return [r.key[1] for r in batch or []]


def test_rescheduled_requests_lead_their_instance_s_batch_and_new_ones_fill_it() -> None:
    scheduler = IterativeScheduler(max_batch_size=4)
    for n in (1, 2):
        scheduler.submit(request(n), 0.0)
    assert keys(scheduler.next_batch_for(0, 0.0)) == [1, 2]
    for n in (3, 4, 5):
        scheduler.submit(request(n), 0.0)
    scheduler.reschedule(0, [request(2), request(1)])
    assert scheduler.has_batch_for(0)
    assert keys(scheduler.next_batch_for(0, 0.0)) == [2, 1, 3, 4]
    assert scheduler.pending_count() == 1 and scheduler.pending_rows() == 1


def test_another_instance_does_not_take_a_rescheduled_request() -> None:
    scheduler = IterativeScheduler(max_batch_size=2)
    scheduler.reschedule(0, [request(1)])
    assert not scheduler.has_batch_for(1)
    assert scheduler.next_batch_for(1, 0.0) is None
    assert scheduler.next_batch(0.0) is None
    assert keys(scheduler.next_batch_for(0, 0.0)) == [1]


def test_rows_and_shape_signatures_bound_what_joins() -> None:
    scheduler = IterativeScheduler(max_batch_size=4)
    scheduler.submit(request(1, rows=3, signature="a"), 0.0)
    scheduler.submit(request(2, rows=2, signature="a"), 0.0)
    assert keys(scheduler.next_batch(0.0)) == [1]  # 3 + 2 rows would pass 4
    scheduler.reschedule(0, [request(1, rows=1, signature="b")])
    assert keys(scheduler.next_batch_for(0, 0.0)) == [1]  # another signature waits
    assert keys(scheduler.next_batch_for(0, 0.0)) == [2]


def test_without_batching_each_batch_is_one_request() -> None:
    scheduler = IterativeScheduler(max_batch_size=0)
    scheduler.submit(request(1), 0.0)
    scheduler.reschedule(0, [request(9)])
    assert keys(scheduler.next_batch_for(0, 0.0)) == [9]
    assert keys(scheduler.next_batch_for(0, 0.0)) == [1]


def test_cancel_takes_only_new_requests_and_a_dead_instance_s_come_back() -> None:
    scheduler = IterativeScheduler(max_batch_size=4)
    scheduler.submit(request(1), 0.0)
    scheduler.reschedule(0, [request(2)])
    assert scheduler.cancel((b"f", 2)) is None  # running, not queued
    assert scheduler.cancel((b"f", 1)) is not None
    assert keys(scheduler.take_rescheduled(0)) == [2]
    assert scheduler.take_rescheduled(0) == []


def test_drain_returns_every_waiting_request() -> None:
    scheduler = IterativeScheduler(max_batch_size=4)
    scheduler.submit(request(1), 0.0)
    scheduler.reschedule(1, [request(2)])
    assert keys(scheduler.drain()) == [2, 1]
    assert scheduler.next_batch_for(1, 0.0) is None and scheduler.pending_rows() == 0


def _config(batcher: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(f'name: "m" max_batch_size: 2 sequence_batching {{ {batcher} }}',
                             model_config_pb2.ModelConfig())


def test_an_iterative_model_without_controls_or_state_is_served() -> None:
    check_iterative(_config("iterative_sequence: true"))


@pytest.mark.parametrize(("batcher", "field"), [
    ('control_input [{ name: "START" control [{ kind: CONTROL_SEQUENCE_START '
     'int32_false_true: [0, 1] }] }]', "control_input"),
    ('state [{ input_name: "I" output_name: "O" data_type: TYPE_FP32 dims: [1] }]', "state"),
])
def test_controls_or_state_with_iterative_sequences_are_unsupported(batcher: str,
                                                                    field: str) -> None:
    with pytest.raises(ShoalError) as caught:
        check_iterative(_config(f"iterative_sequence: true {batcher}"))
    assert caught.value.code == ErrorCode.UNSUPPORTED
    assert f"sequence_batching.{field}" in caught.value.message
