"""What a worker's BatchResult means for a model version's bookkeeping: statistics, the requests
that end (with the answer each gets), the decoupled requests that keep streaming, and the output
states a sequence batch wrote. No sockets: the loop delivers the answers.
"""

from __future__ import annotations

from shoal.broker.model_runtime import ModelVersionRuntime
from shoal.broker.pool import WorkerHandle
from shoal.broker.schedulers.base import RequestKey
from shoal.broker.trace_stamps import record_compute, with_stamps
from shoal.errors import ErrorCode
from shoal.messages import BatchResult, Error, InferResponse, WrittenState

Outcome = tuple[RequestKey, bytes, InferResponse]  # request, its frontend, its answer


def batch_outcomes(runtime: ModelVersionRuntime, keys: list[RequestKey], rows: int,
                   early_successes: int, message: BatchResult, streams: set[int], now: float
                   ) -> list[Outcome]:
    """Record the execution and end each request of it that ended, in ``keys`` order
    (``rows``: the batch's at dispatch; ``early_successes``: its decoupled requests whose
    stream already ended in success). A decoupled request without a Result keeps answering:
    its execution id joins ``streams`` (the worker's open streams) and it keeps the batch's
    durations for its end. Counting: ``stats.py``."""
    by_exec = {r.request_id: r for r in message.results}
    stats, timings = runtime.stats, message.timings
    stats.record_execution(rows, timings)
    outcomes: list[Outcome] = []
    succeeded: list[int] = []  # durations, recorded at once
    queued: list[int] = []
    succeeded_rows = 0
    for key in keys:
        pending = runtime.requests.get(key)
        exec_id = pending.exec_id if pending is not None else 0
        result = by_exec.get(exec_id)
        if pending is not None and pending.trace is not None:
            record_compute(pending.trace, timings)
        if runtime.decoupled and result is None:
            if pending is not None:
                streams.add(exec_id)
                pending.compute = timings
            continue
        pending = runtime.forget(key)
        if pending is None:
            continue
        elapsed = int((now - pending.arrival) * 1e9)
        if result is None:
            error = Error(ErrorCode.INTERNAL, "worker returned no result for the request")
            response = InferResponse(key[1], error=error)
            stats.record_failure(elapsed, "BACKEND")
        else:
            if result.error is None:
                response = InferResponse(key[1], runtime.version, result.outputs,
                                         result.parameters, None, message.lease)
            else:
                response = InferResponse(key[1], error=result.error)
            if result.error is None or result.error.in_response:
                succeeded.append(elapsed)
                queued.append(pending.queued_ns)
                succeeded_rows += pending.request.batch_size
            else:
                stats.record_failure(elapsed, "BACKEND")
        if pending.trace is not None:
            response = with_stamps(response, pending.trace)
        outcomes.append((key, pending.frontend, response))
    stats.record_successes(succeeded, queued, succeeded_rows)
    stats.record_compute(timings, early_successes + len(succeeded))
    return outcomes


def written_states(runtime: ModelVersionRuntime, keys: list[RequestKey], message: BatchResult
                   ) -> dict[RequestKey, list[WrittenState]]:
    """The output states each successful request of a sequence batch wrote (call before
    ``batch_outcomes`` forgets the requests)."""
    by_exec = {r.request_id: r for r in message.results if r.states and r.error is None}
    written: dict[RequestKey, list[WrittenState]] = {}
    for key in keys:
        pending = runtime.requests.get(key)
        result = by_exec.get(pending.exec_id) if pending is not None else None
        if result is not None:
            written[key] = result.states
    return written


def reschedule(runtime: ModelVersionRuntime, handle: WorkerHandle, keys: list[RequestKey],
               rescheduled: set[int]) -> list[RequestKey]:
    """The requests of a batch that the model released with RESCHEDULE wait for their
    instance's next batch (iterative sequences, ``schedulers/iterative.py``); returns the
    others, which ended or keep streaming, and those the scheduling cannot run again
    (they end as answered with nothing)."""
    index = next(i for i, slot in enumerate(runtime.instances) if slot.worker is handle)
    again = {key for key in keys if (pending := runtime.requests.get(key)) is not None
             and pending.exec_id in rescheduled}
    refused = set(runtime.scheduling.reschedule(
        index, [runtime.queued_again(key) for key in keys if key in again]))
    return [key for key in keys if key not in again or key in refused]
