"""The broker loop in process (``harness.py``): its scheduling, rescheduling, failure and
scrape logic, with stand-in frontend and workers over the real sockets and messages."""

from __future__ import annotations

import pathlib
import threading

from shoal.errors import ErrorCode
from shoal.messages import Batch, BatchResult, BatchTimings, Result
from tests.broker.harness import FakeWorker, broker

ITERATIVE = """
    name: "it"
    backend: "python"
    max_batch_size: 4
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
    sequence_batching { iterative_sequence: true }
"""

BATCHING = """
    name: "dyn"
    backend: "python"
    max_batch_size: 8
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
    dynamic_batching { max_queue_delay_microseconds: 200000 }
"""


def test_a_rescheduled_request_goes_back_to_its_instance_first(tmp_path: pathlib.Path) -> None:
    runs: dict[int, int] = {}

    def twice_each(worker: FakeWorker, batch: Batch) -> BatchResult:
        again, done = [], []
        for r in batch.requests:
            runs[r.request_id] = runs.get(r.request_id, 0) + 1
            (again if runs[r.request_id] < 2 else done).append(r.request_id)
        return BatchResult(batch.batch_id, [Result(i) for i in done], BatchTimings(0, 0, 0),
                           rescheduled=again)

    with broker(tmp_path, {"it": ITERATIVE}, twice_each) as harness:
        harness.wait_ready("it")
        first = harness.infer("it")
        answers = harness.answers(1)
        assert answers[first].error is None
        (worker,) = harness.workers
        assert len(worker.batches) == 2  # the same exec id ran twice, on the one instance
        assert [r.request_id for r in worker.batches[0].requests] == \
               [r.request_id for r in worker.batches[1].requests]


def test_requests_arriving_together_meet_in_one_dynamic_batch(tmp_path: pathlib.Path) -> None:
    with broker(tmp_path, {"dyn": BATCHING}) as harness:
        harness.wait_ready("dyn")
        ids = [harness.infer("dyn") for _ in range(5)]
        answers = harness.answers(5)
        assert sorted(answers) == sorted(ids)
        (worker,) = harness.workers
        assert [len(b.requests) for b in worker.batches] == [5]


def test_a_dead_worker_fails_what_it_held_and_is_replaced(tmp_path: pathlib.Path) -> None:
    holding = threading.Event()

    def hold_first(worker: FakeWorker, batch: Batch) -> BatchResult | None:
        if not holding.is_set():
            holding.set()
            return None  # never answers: it dies with the batch
        return BatchResult(batch.batch_id, [Result(r.request_id) for r in batch.requests],
                           BatchTimings(0, 0, 0))

    with broker(tmp_path, {"dyn": BATCHING}, hold_first) as harness:
        harness.wait_ready("dyn")
        held = harness.infer("dyn")
        assert holding.wait(10)
        harness.workers[0].kill()
        answer = harness.answers(1)[held]
        assert answer.error is not None and answer.error.code is ErrorCode.INTERNAL
        assert "dyn_0" in answer.error.message
        harness.wait_ready("dyn")  # the replacement, a new stand-in
        served = harness.infer("dyn")
        assert harness.answers(1)[served].error is None
        assert len(harness.workers) == 2


def test_a_metrics_scrape_asks_each_serving_worker(tmp_path: pathlib.Path) -> None:
    from shoal.messages import CollectCustomMetrics

    with broker(tmp_path, {"dyn": BATCHING}) as harness:
        harness.wait_ready("dyn")
        reply = harness.stats(custom_metrics=True)
        assert reply.error is None
        (worker,) = harness.workers
        assert any(isinstance(m, CollectCustomMetrics) for m in worker.control)


SLOW_QUEUE = """
    name: "slow"
    backend: "python"
    max_batch_size: 8
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
    dynamic_batching { max_queue_delay_microseconds: 2000000 preferred_batch_size: [ 8 ] }
"""

SEQUENCE = """
    name: "seq"
    backend: "python"
    max_batch_size: 0
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
    sequence_batching { max_sequence_idle_microseconds: 5000000 }
    instance_group [ { count: 2 kind: KIND_CPU } ]
"""


def test_a_queued_request_cancelled_never_reaches_a_worker(tmp_path: pathlib.Path) -> None:
    with broker(tmp_path, {"slow": SLOW_QUEUE}) as harness:
        harness.wait_ready("slow")
        queued = harness.infer("slow")  # waits up to 2 s for a batch of 8
        harness.cancel(queued)
        answer = harness.answers(1)[queued]
        assert answer.error is not None and answer.error.code is ErrorCode.CANCELLED
        assert harness.workers[0].batches == []


def test_a_sequence_stays_on_one_instance(tmp_path: pathlib.Path) -> None:
    start, end = 1, 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END
    with broker(tmp_path, {"seq": SEQUENCE}) as harness:
        harness.wait_ready("seq")
        for correlation in (11, 22):
            flags = [start, 0, 0, end]
            for flag in flags:
                sent = harness.infer("seq", correlation_id=correlation, flags=flag)
                assert harness.answers(1)[sent].error is None
        ran: dict[int, set[str]] = {}
        for worker in harness.workers:
            for batch in worker.batches:
                for request in batch.requests:
                    ran.setdefault(int(request.correlation_id), set()).add(
                        worker.spec.instance_name)
        assert sorted(ran) == [11, 22]
        assert all(len(instances) == 1 for instances in ran.values())
