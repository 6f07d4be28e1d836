"""Ensembles in the broker loop: each ensemble request is an ``EnsembleRun`` whose steps are
submitted to the composing models' own schedulers (they batch as usual) under the broker's
internal identity ``INTERNAL``; their answers come back here instead of going to a frontend.

Admission: the calls a run makes ready wait in the ensemble version's ``StepAdmission``
(``ensemble_scheduling.max_inflight_requests``, Triton's per-step limit shared by all requests of
the ensemble; 0: issued at once). An answer gives its step's slot back; a run that failed or was
cancelled withdraws the calls it still had waiting.

Cancellation (``cancel``): the run ends with CANCELLED; its waiting calls are withdrawn, its
issued step requests are cancelled in their composing models (dropped when queued, told when
running), and the client is answered once none of them is in flight any more (they may still
read the request's inputs until then).

Statistics (``stats.py``, Triton's ensemble rules): a success counts the request end to end,
one execution of its batch size, and the sums of the queue and compute durations of the
composing requests it made (``on_step_timings``); a failure counts in ``fail`` with its reason.

Memory: step outputs stay in the composing workers' arenas. The run tells us which leases it no
longer needs (released at once) and which back its result; those are kept under one synthetic
lease ``Lease(ENSEMBLE_LEASE, run id)`` that the frontend releases like any other.
Single-threaded: the broker loop.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from shoal.broker.ensemble import EnsembleRun, StepAdmission, StepCall, step_request
from shoal.broker.model_runtime import ModelVersionRuntime
from shoal.errors import ErrorCode
from shoal.messages import BatchTimings, Error, InferRequest, InferResponse, Lease

logger = logging.getLogger(__name__)

INTERNAL = b"\x00ensemble"      # frontend identity of step requests (never a real frontend)
ENSEMBLE_LEASE = "#ensemble"    # Lease.instance of an ensemble response's synthetic lease

Submit = Callable[[bytes, InferRequest, float], None]
Answer = Callable[[bytes, InferResponse], None]
Release = Callable[[list[Lease]], None]
Cancel = Callable[[bytes, int, float], None]
"""Cancel the request (frontend identity, request id) wherever it is queued or running."""

_CANCELLED = Error(ErrorCode.CANCELLED, "request cancelled")


@dataclass
class _Run:
    run: EnsembleRun
    runtime: ModelVersionRuntime
    admission: StepAdmission[StepCall]
    frontend: bytes
    request: InferRequest
    arrival: float
    issued: dict[int, int] = field(default_factory=dict)  # step -> its step request id
    compute: list[int] = field(default_factory=lambda: [0, 0, 0])  # summed input/infer/output ns
    queued_ns: int = 0  # summed queue time of its step requests
    failure: str = ""  # Triton's failure reason, once known
    cancelled: bool = False


class EnsembleDriver:
    def __init__(self, submit: Submit, answer: Answer, release: Release,
                 cancel: Cancel | None = None) -> None:
        self._submit = submit
        self._answer = answer
        self._release = release
        self._cancel = cancel
        self._runs: dict[int, _Run] = {}
        self._by_request: dict[tuple[bytes, int], int] = {}  # (frontend, request id) -> run id
        self._steps: dict[int, tuple[int, int]] = {}  # step request id -> (run id, step)
        # step request id -> its compute durations and its time queued
        self._timings: dict[int, tuple[BatchTimings, int]] = {}
        self._results: dict[int, list[Lease]] = {}    # run id -> leases behind its response
        self._admissions: dict[tuple[str, int], StepAdmission[StepCall]] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._runs)

    def in_flight(self, runtime: ModelVersionRuntime) -> int:
        """Requests of this ensemble version not yet answered (its ``pending`` statistic)."""
        return sum(1 for state in self._runs.values() if state.runtime is runtime)

    def start(self, frontend: bytes, request: InferRequest, runtime: ModelVersionRuntime,
              now: float) -> None:
        assert runtime.ensemble is not None
        run = EnsembleRun(runtime.ensemble, {ref.name: ref for ref in request.inputs},
                          batch_size=request.batch_size, requested_outputs=request.outputs)
        run_id = next(self._ids)
        admission = self._admission(runtime)
        self._runs[run_id] = _Run(run, runtime, admission, frontend, request, now)
        self._by_request[(frontend, request.request_id)] = run_id
        self._advance(run_id, now)
        self._issue(admission, now)

    def on_step_timings(self, step_request_id: int, timings: BatchTimings,
                        queued_ns: int) -> None:
        """The compute durations of the execution that answered one of our step requests
        and the time that request queued; called before that answer reaches ``on_answer``."""
        self._timings[step_request_id] = (timings, queued_ns)

    def on_answer(self, response: InferResponse, now: float) -> None:
        """A composing model answered one of our step requests."""
        timings = self._timings.pop(response.request_id, None)
        located = self._steps.pop(response.request_id, None)
        if located is None:
            if response.lease is not None:
                self._release([response.lease])
            return
        run_id, step = located
        state = self._runs[run_id]
        del state.issued[step]
        state.admission.done(step)
        if response.error is not None:
            state.failure = state.failure or _failure_reason(response.error)
            state.run.on_step_done(step, response.error, response.lease)
        else:
            if timings is not None:
                compute, queued_ns = timings
                state.compute[0] += compute.compute_input_ns
                state.compute[1] += compute.compute_infer_ns
                state.compute[2] += compute.compute_output_ns
                state.queued_ns += queued_ns
            state.run.on_step_done(step, {ref.name: ref for ref in response.outputs},
                                   response.lease)
        self._advance(run_id, now)
        self._issue(state.admission, now)

    def requests_of(self, frontend: bytes) -> list[int]:
        """The request ids of ``frontend``'s ensemble requests still running."""
        return [request_id for (owner, request_id) in self._by_request if owner == frontend]

    def cancel(self, frontend: bytes, request_id: int, now: float) -> bool:
        """The client cancelled this request; False when it is not a running ensemble request
        of ours (the caller looks elsewhere)."""
        run_id = self._by_request.get((frontend, request_id))
        if run_id is None:
            return False
        state = self._runs[run_id]
        if state.cancelled:
            return True
        state.cancelled = True
        state.failure = state.failure or "CANCELED"
        state.run.cancel(_CANCELLED)
        if self._cancel is not None:
            for step_request_id in list(state.issued.values()):
                self._cancel(INTERNAL, step_request_id, now)
        self._advance(run_id, now)
        self._issue(state.admission, now)
        return True

    def release(self, run_ids: list[int]) -> None:
        """The frontend is done with these ensemble responses."""
        for run_id in run_ids:
            self._release(self._results.pop(run_id, []))

    def _admission(self, runtime: ModelVersionRuntime) -> StepAdmission[StepCall]:
        """The version's admission; a reloaded plan gets a fresh one (runs of the old plan keep
        theirs until they end)."""
        key = (runtime.name, runtime.version)
        admission = self._admissions.get(key)
        if admission is None or admission.plan is not runtime.ensemble:
            assert runtime.ensemble is not None
            admission = self._admissions[key] = StepAdmission(runtime.ensemble)
        return admission

    def _advance(self, run_id: int, now: float) -> None:
        state = self._runs[run_id]
        self._release(state.run.releasable_leases())
        for call in state.run.ready_steps():
            state.admission.enqueue(call.step, run_id, call)
        if state.run.error is not None:
            for step, _call in state.admission.withdraw(run_id):
                state.run.withdraw(step)
            self._release(state.run.releasable_leases())
        if state.run.finished():
            self._finish(run_id, now)

    def _issue(self, admission: StepAdmission[StepCall], now: float) -> None:
        """Submit every call the admission lets through now."""
        for step, run_id, call in admission.admit():
            state = self._runs[run_id]
            step_request_id = next(self._ids)
            self._steps[step_request_id] = (run_id, step)
            state.issued[step] = step_request_id
            self._submit(INTERNAL, step_request(call, state.request, step_request_id), now)

    def _finish(self, run_id: int, now: float) -> None:
        state = self._runs.pop(run_id)
        self._by_request.pop((state.frontend, state.request.request_id), None)
        elapsed = int((now - state.arrival) * 1e9)
        result = state.run.result()
        self._release(state.run.releasable_leases())
        if isinstance(result, Error):
            state.runtime.stats.record_failure(elapsed, state.failure or "OTHER")
            self._answer(state.frontend, InferResponse(state.request.request_id, error=result))
            return
        compute = BatchTimings(*state.compute)
        # Triton's ensemble queue time is the sum of its composing requests' queue times
        state.runtime.stats.record_ensemble_success(state.request.batch_size, elapsed,
                                                    state.queued_ns, compute)
        if state.frontend == INTERNAL:  # a nested ensemble: its sums count in the outer run
            self._timings[state.request.request_id] = (compute, state.queued_ns)
        outputs = [msgspec.structs.replace(ref, name=name) for name, ref in result.items()]
        leases = state.run.result_leases()
        lease = None
        if leases:
            self._results[run_id] = leases
            lease = Lease(ENSEMBLE_LEASE, run_id)
        self._answer(state.frontend, InferResponse(state.request.request_id,
                                                   state.runtime.version, outputs, {}, None,
                                                   lease))


def _failure_reason(error: Error) -> str:
    """The reason a failing step gives its ensemble request (Triton's metric label)."""
    return "CANCELED" if error.code == ErrorCode.CANCELLED else "BACKEND"
