"""The adaptive queue delay: the estimate (arrivals.py) and the dynamic batcher using it."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from shoal.broker.schedulers.arrivals import ArrivalEstimate
from shoal.broker.schedulers.base import QueuedRequest
from shoal.broker.schedulers.dynamic import DynamicBatcher, DynamicBatcherConfig
from shoal.errors import ShoalError

from .helpers import key, numbers

DELAY_S = 0.001


def adaptive(max_batch_size: int = 32, delay_s: float = DELAY_S,
             on: bool = True) -> DynamicBatcher:
    return DynamicBatcher(DynamicBatcherConfig(
        max_batch_size=max_batch_size, max_queue_delay_us=round(delay_s * 1e6),
        adaptive_delay=on))


def arrive(batcher: DynamicBatcher, n: int, at: float, in_flight: int) -> None:
    assert batcher.submit(QueuedRequest(key(n), 1, at, in_flight=in_flight), at) is None


# ------------------------------------------------------------------ the estimate


def test_a_fresh_estimate_expects_partners() -> None:
    estimate = ArrivalEstimate(DELAY_S)
    assert not estimate.partner_unlikely()


def test_lone_arrivals_make_a_partner_unlikely_after_about_seven() -> None:
    estimate = ArrivalEstimate(DELAY_S)
    now = 0.0
    for _ in range(6):
        estimate.observe(now, in_flight=0)
        now += 0.0005  # faster than the delay: only the overlap can tell
    assert not estimate.partner_unlikely()
    estimate.observe(now, in_flight=0)
    assert estimate.partner_unlikely()


def test_overlapping_arrivals_keep_partners_expected() -> None:
    estimate = ArrivalEstimate(DELAY_S)
    for i in range(100):
        estimate.observe(i * 1e-5, in_flight=5)
    assert not estimate.partner_unlikely()


def test_slow_arrivals_make_a_partner_unlikely_even_when_they_overlap() -> None:
    estimate = ArrivalEstimate(DELAY_S)
    for i in range(30):
        estimate.observe(i * 0.01, in_flight=1)  # 10 ms apart, the delay is 1 ms
    assert estimate.partner_unlikely()


def test_a_long_idle_gap_is_capped_so_a_burst_is_believed_quickly() -> None:
    estimate = ArrivalEstimate(DELAY_S)
    estimate.observe(0.0, in_flight=1)
    estimate.observe(100.0, in_flight=1)  # 100 s idle counts as 4 delays
    assert estimate.mean_gap == pytest.approx(0.1 * 4 * DELAY_S)


def test_the_gap_rule_compares_with_the_whole_delay_not_the_wait_left() -> None:
    """Partners every 0.4 ms with a 1 ms delay: wait, even when only 0.2 ms is left (cutting
    waits short near their end would shrink the batches under load)."""
    estimate = ArrivalEstimate(DELAY_S)
    for i in range(50):
        estimate.observe(i * 0.0004, in_flight=1)
    assert not estimate.partner_unlikely()
    for i in range(50, 80):
        estimate.observe(0.02 + (i - 50) * 0.0015, in_flight=1)  # now every 1.5 ms
    assert estimate.partner_unlikely()


# ------------------------------------------------------------------ the batcher


def test_closed_loop_single_client_is_sent_at_once_after_warming_up() -> None:
    """c=1 with a round trip shorter than the delay: every arrival finds the system empty, so
    after the warm-up each request leaves at once instead of waiting the whole delay."""
    batcher = adaptive()
    now, waited = 0.0, []
    for n in range(20):
        arrive(batcher, n, now, in_flight=0)
        batch = batcher.next_batch(now)
        if batch is None:  # waits the delay, as Triton does
            deadline = batcher.next_deadline(now)
            assert deadline == pytest.approx(now + DELAY_S)
            now += DELAY_S
            batch = batcher.next_batch(now)
            waited.append(n)
        assert numbers(batch) == [n]
        now += 0.0004  # the round trip: answer + the client's next request
    assert waited == list(range(6))  # the 7th lone arrival has overlap 0.9**7 < 0.5


def test_under_load_the_batcher_still_waits_for_partners() -> None:
    batcher = adaptive()
    for n in range(200):  # a crowd: every arrival overlaps others, 1 µs apart
        arrive(batcher, n, n * 1e-6, in_flight=10)
    batcher.drain()
    arrive(batcher, 1000, 0.01, in_flight=10)
    assert batcher.next_batch(0.01) is None  # waits for the partners it expects
    assert batcher.next_deadline(0.01) == pytest.approx(0.01 + DELAY_S)
    for n in range(1, 32):
        arrive(batcher, 1000 + n, 0.01 + n * 1e-6, in_flight=10)
    assert numbers(batcher.next_batch(0.01 + 31e-6)) == list(range(1000, 1032))


def test_with_the_adaptive_delay_off_a_lone_request_waits_the_whole_delay() -> None:
    batcher = adaptive(on=False)
    now = 0.0
    for n in range(20):
        arrive(batcher, n, now, in_flight=0)
        assert batcher.next_batch(now) is None
        now += DELAY_S
        assert numbers(batcher.next_batch(now)) == [n]


def test_sending_early_takes_everything_queued() -> None:
    batcher = adaptive()
    for n in range(10):  # warm up as a lone client
        arrive(batcher, n, n * 0.01, in_flight=0)
        batcher.next_batch(n * 0.01 + DELAY_S)
    arrive(batcher, 100, 1.0, in_flight=0)
    arrive(batcher, 101, 1.0, in_flight=1)
    assert numbers(batcher.next_batch(1.0)) == [100, 101]


def _config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_the_model_parameter_turns_it_off_and_it_is_on_by_default() -> None:
    base = 'name: "m" max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 100 }'
    assert DynamicBatcherConfig.from_model_config(_config(base)).adaptive_delay
    off = base + ' parameters { key: "shoal_adaptive_queue_delay" value { string_value: "false" } }'
    assert not DynamicBatcherConfig.from_model_config(_config(off)).adaptive_delay


def test_a_bad_parameter_value_is_refused_naming_it() -> None:
    bad = ('name: "m" max_batch_size: 8 dynamic_batching { } parameters { key: '
           '"shoal_adaptive_queue_delay" value { string_value: "maybe" } }')
    with pytest.raises(ShoalError, match="shoal_adaptive_queue_delay must be 'true' or 'false'"):
        DynamicBatcherConfig.from_model_config(_config(bad))
