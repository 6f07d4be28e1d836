"""The adaptive queue delay, in the broker alone (``harness.py``): a lone client stops waiting
for partners that never come, a burst still meets in batches, and the model parameter turns the
adaptation off. (These ran through a whole server before; nothing in them is a worker's.)"""

from __future__ import annotations

import pathlib
import threading
import time

from shoal.messages import Batch, BatchResult
from tests.broker.harness import BrokerHarness, FakeWorker, answer_all, broker

DELAY_US = 200_000  # 200 ms: far longer than a round trip through the loop
OFF = 'parameters { key: "shoal_adaptive_queue_delay" value { string_value: "false" } }'


def config(name: str, extra: str = "") -> str:
    return f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 8
        input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        dynamic_batching {{ max_queue_delay_microseconds: {DELAY_US} }}
        {extra}
    """


def timed_call(harness: BrokerHarness, model: str) -> float:
    start = time.monotonic()
    request = harness.infer(model)
    answer = harness.answers(1)[request]
    assert answer.error is None, answer.error
    return time.monotonic() - start


def test_a_lone_client_comes_back_well_before_the_delay(tmp_path: pathlib.Path) -> None:
    with broker(tmp_path, {"lone": config("lone")}) as harness:
        harness.wait_ready("lone")
        times = [timed_call(harness, "lone") for _ in range(12)]
    assert min(times[:3]) >= 0.19, f"the first requests should wait the delay: {times}"
    # after a few lone arrivals the batcher stops waiting for partners that never come
    assert max(times[-4:]) < 0.1, f"later lone requests still waited: {times}"


def test_with_the_parameter_off_a_lone_client_waits_the_whole_delay(
        tmp_path: pathlib.Path) -> None:
    with broker(tmp_path, {"patient": config("patient", OFF)}) as harness:
        harness.wait_ready("patient")
        times = [timed_call(harness, "patient") for _ in range(10)]
    assert min(times) >= 0.19, times


def test_a_burst_still_batches_after_lone_requests(tmp_path: pathlib.Path) -> None:
    slow = threading.Event()

    def busy(worker: FakeWorker, batch: Batch) -> BatchResult | None:
        if slow.is_set():
            time.sleep(0.05)  # an execution long enough for the burst to queue behind it
        return answer_all(worker, batch)

    with broker(tmp_path, {"burst": config("burst")}, busy) as harness:
        harness.wait_ready("burst")
        for _ in range(10):  # teach it that partners do not come
            timed_call(harness, "burst")
        assert timed_call(harness, "burst") < 0.1
        (worker,) = harness.workers
        taught = len(worker.batches)
        slow.set()
        ids = [harness.infer("burst") for _ in range(32)]
        answers = harness.answers(32)
        assert sorted(answers) == sorted(ids)
        sizes = [len(b.requests) for b in worker.batches[taught:]]
    assert max(sizes) > 1, f"the burst ran one request per execution: {sizes}"
    assert len(sizes) < 32
