"""EnsembleDriver with fake broker callbacks: ensemble statistics (Triton's rules), the
max_inflight_requests admission, failures and cancellation freeing capacity."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import cast

from shoal.broker.ensemble import EnsemblePlan
from shoal.broker.ensemble.driver import ENSEMBLE_LEASE, INTERNAL, EnsembleDriver
from shoal.broker.model_runtime import ModelVersionRuntime
from shoal.broker.stats import ModelVersionStats
from shoal.errors import ErrorCode
from shoal.messages import BatchTimings, Error, InferRequest, InferResponse, Lease, TensorRef
from tests.broker.ensemble.helpers import CLASSES, IMAGE_DIMS, diamond_plan, docs_plan, output, ref

FRONTEND = b"fe-1"
BATCH = 2
OUTPUTS = {
    "preprocess": output("PREPROCESSED_OUTPUT", [BATCH, *IMAGE_DIMS], "pre"),
    "classify": output("CLASSIFICATION_OUTPUT", [BATCH, CLASSES], "cls"),
    "segment": output("SEGMENTATION_OUTPUT", [BATCH, *IMAGE_DIMS], "seg"),
    "combine": output("SUMMARY", [BATCH, CLASSES], "comb"),
}


@dataclass
class FakeRuntime:
    """What the driver reads of a ModelVersionRuntime."""

    ensemble: EnsemblePlan
    name: str = "e"
    version: int = 1
    stats: ModelVersionStats = field(default_factory=lambda: ModelVersionStats("e", 1))


class Broker:
    """The driver's callbacks, recording what it asks of the broker."""

    def __init__(self, plan: EnsemblePlan, limit: int = 0) -> None:
        self.runtime = FakeRuntime(dataclasses.replace(plan, max_inflight_requests=limit))
        self.pending: list[InferRequest] = []  # submitted step requests not answered yet
        self.answers: dict[int, InferResponse] = {}
        self.released: list[Lease] = []
        self.cancelled: list[int] = []
        self.max_running: dict[str, int] = {}
        self.leases = 0
        self.driver = EnsembleDriver(self.submit, self.answer, self.released.extend,
                                     self.cancel)

    def submit(self, identity: bytes, request: InferRequest, now: float) -> None:
        assert identity == INTERNAL
        self.pending.append(request)
        running = sum(r.model == request.model for r in self.pending)
        self.max_running[request.model] = max(self.max_running.get(request.model, 0), running)

    def answer(self, identity: bytes, response: InferResponse) -> None:
        assert identity == FRONTEND and response.request_id not in self.answers
        self.answers[response.request_id] = response

    def cancel(self, identity: bytes, request_id: int, now: float) -> None:
        assert identity == INTERNAL
        self.cancelled.append(request_id)

    def start(self, request_id: int, now: float = 0.0) -> None:
        image = ref("IMAGE", "BYTES", [BATCH, 1])
        request = InferRequest(request_id, "e", 1, [image], batch_size=BATCH)
        self.driver.start(FRONTEND, request, cast(ModelVersionRuntime, self.runtime), now)

    def models(self) -> list[str]:
        return [r.model for r in self.pending]

    def reply(self, model: str, *, error: Error | None = None, now: float = 0.0,
              timings: BatchTimings | None = None, queued_ns: int = 0) -> Lease | None:
        """The oldest pending request of ``model`` is answered (its outputs, or ``error``)."""
        request = next(r for r in self.pending if r.model == model)
        self.pending.remove(request)
        if timings is not None:
            self.driver.on_step_timings(request.request_id, timings, queued_ns)
        if error is not None:
            self.driver.on_answer(InferResponse(request.request_id, error=error), now)
            return None
        self.leases += 1
        lease = Lease(model, self.leases)
        outputs: list[TensorRef] = [OUTPUTS[model]]
        self.driver.on_answer(InferResponse(request.request_id, 1, outputs, {}, None, lease), now)
        return lease


# ------------------------------------------------------------------ statistics


def test_success_counts_one_execution_with_the_composing_queue_and_compute_sums() -> None:
    broker = Broker(docs_plan())
    broker.start(7, now=10.0)
    broker.reply("preprocess", now=10.1, timings=BatchTimings(1, 10, 100), queued_ns=4000)
    broker.reply("classify", now=10.2, timings=BatchTimings(2, 20, 200), queued_ns=500)
    broker.reply("segment", now=10.3, timings=BatchTimings(3, 30, 300), queued_ns=60)
    assert broker.answers[7].error is None
    stats = broker.runtime.stats.snapshot(0)
    assert (stats.inference_count, stats.execution_count) == (BATCH, 1)
    assert stats.success.count == 1
    assert abs(stats.success.ns - 300_000_000) < 1000
    assert (stats.queue.count, stats.queue.ns) == (1, 4560)
    assert (stats.compute_input.count, stats.compute_input.ns) == (1, 6)
    assert (stats.compute_infer.count, stats.compute_infer.ns) == (1, 60)
    assert (stats.compute_output.count, stats.compute_output.ns) == (1, 600)
    assert [(b.batch_size, b.compute_infer.count, b.compute_infer.ns)
            for b in stats.batch_stats] == [(BATCH, 1, 60)]
    assert stats.fail.count == 0 and stats.last_inference_ms > 0


def test_failed_step_counts_a_failure_with_its_reason_and_no_execution() -> None:
    broker = Broker(docs_plan())
    broker.start(1, now=0.0)
    broker.reply("preprocess", error=Error(ErrorCode.INTERNAL, "boom"), now=0.5)
    assert broker.answers[1].error is not None and "boom" in broker.answers[1].error.message
    stats = broker.runtime.stats.snapshot(0)
    assert stats.fail.count == 1 and abs(stats.fail.ns - 500_000_000) < 1000
    assert stats.fail_by_reason == {"BACKEND": 1}
    assert (stats.success.count, stats.execution_count, stats.inference_count) == (0, 0, 0)
    assert stats.last_inference_ms == 0


# ------------------------------------------------------------------ max_inflight_requests


def test_limit_holds_step_calls_until_answers_free_slots_and_every_request_completes() -> None:
    broker = Broker(docs_plan(), limit=1)
    for request_id in (1, 2, 3):
        broker.start(request_id)
    assert broker.models() == ["preprocess"]  # two requests wait for the step's one slot
    while broker.pending:
        broker.reply(broker.pending[0].model)
    assert sorted(broker.answers) == [1, 2, 3]
    assert all(a.error is None for a in broker.answers.values())
    assert broker.max_running == {"preprocess": 1, "classify": 1, "segment": 1}
    assert broker.runtime.stats.snapshot(0).success.count == 3


def test_in_flight_counts_the_unanswered_requests_of_the_ensemble() -> None:
    broker = Broker(docs_plan(), limit=1)
    runtime = cast(ModelVersionRuntime, broker.runtime)
    for request_id in (1, 2):
        broker.start(request_id)
    assert broker.driver.in_flight(runtime) == 2  # the ensemble's `pending` statistic
    while broker.pending:
        broker.reply(broker.pending[0].model)
    assert broker.driver.in_flight(runtime) == 0


def test_without_a_limit_all_first_steps_are_issued_at_once() -> None:
    broker = Broker(docs_plan())
    for request_id in (1, 2, 3):
        broker.start(request_id)
    assert broker.models() == ["preprocess"] * 3


def test_limit_two_lets_two_calls_of_a_step_run_together() -> None:
    broker = Broker(docs_plan(), limit=2)
    for request_id in range(1, 6):
        broker.start(request_id)
    while broker.pending:
        broker.reply(broker.pending[-1].model)  # newest first: answers out of order
    assert len(broker.answers) == 5 and all(a.error is None for a in broker.answers.values())
    assert broker.max_running == {"preprocess": 2, "classify": 2, "segment": 2}


def test_failing_run_withdraws_its_waiting_calls_and_frees_their_inputs() -> None:
    broker = Broker(diamond_plan(), limit=1)
    broker.start(1)
    broker.start(2)
    broker.reply("preprocess")  # run 1: classify and segment go; run 2's preprocess goes
    broker.reply("classify")  # run 1's classify done: the slot is free
    pre_lease = broker.reply("preprocess")  # run 2: classify goes, segment waits (run 1's)
    assert broker.models() == ["segment", "classify"]
    broker.reply("classify", error=Error(ErrorCode.INTERNAL, "boom"))
    assert broker.answers[2].error is not None  # answered at once: nothing of it in flight
    assert pre_lease in broker.released  # its waiting segment no longer holds the input
    broker.reply("segment")
    broker.reply("combine")
    assert broker.answers[1].error is None
    assert broker.models() == [] and broker.max_running["segment"] == 1


# ------------------------------------------------------------------ cancellation


def test_cancel_of_a_waiting_request_answers_at_once_and_issues_nothing() -> None:
    broker = Broker(docs_plan(), limit=1)
    broker.start(1)
    broker.start(2)
    assert broker.driver.cancel(FRONTEND, 2, 0.0)
    assert broker.answers[2].error == Error(ErrorCode.CANCELLED, "request cancelled")
    assert broker.cancelled == []  # nothing of it was issued
    assert broker.runtime.stats.snapshot(0).fail_by_reason == {"CANCELED": 1}
    while broker.pending:
        broker.reply(broker.pending[0].model)
    assert broker.answers[1].error is None
    assert broker.max_running["preprocess"] == 1 and len(broker.driver) == 0


def test_cancel_of_a_running_request_cancels_its_steps_and_frees_the_slot() -> None:
    broker = Broker(docs_plan(), limit=1)
    broker.start(1)
    broker.start(2)
    step_id = broker.pending[0].request_id
    assert broker.driver.cancel(FRONTEND, 1, 0.0)
    assert broker.driver.cancel(FRONTEND, 1, 0.0)  # again: no second cancel of its steps
    assert broker.cancelled == [step_id]
    assert 1 not in broker.answers  # its step may still read the inputs
    broker.reply("preprocess", error=Error(ErrorCode.CANCELLED, "request cancelled"))
    assert broker.answers[1].error is not None
    assert broker.answers[1].error.code == ErrorCode.CANCELLED
    assert broker.models() == ["preprocess"]  # request 2 got the freed slot
    while broker.pending:
        broker.reply(broker.pending[0].model)
    assert broker.answers[2].error is None
    assert not broker.driver.cancel(FRONTEND, 2, 0.0)  # finished: not ours any more
    assert not broker.driver.cancel(b"other", 1, 0.0)


def test_result_leases_go_to_the_frontend_and_come_back_once() -> None:
    broker = Broker(docs_plan())
    broker.start(1)
    pre = broker.reply("preprocess")
    cls = broker.reply("classify")
    seg = broker.reply("segment")
    answer = broker.answers[1]
    assert answer.lease is not None and answer.lease.instance == ENSEMBLE_LEASE
    assert broker.released == [pre]
    broker.driver.release([answer.lease.lease_id])
    assert sorted(broker.released, key=str) == sorted([pre, cls, seg], key=str)
