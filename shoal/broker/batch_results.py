"""What a worker's BatchResult means for a model version's bookkeeping: statistics, the requests
that end (with the answer each gets), the decoupled requests that keep streaming, and the output
states a sequence batch wrote. No sockets: the loop delivers the answers.
"""

from __future__ import annotations

from shoal.broker.model_runtime import ModelVersionRuntime
from shoal.broker.schedulers.base import RequestKey
from shoal.broker.trace_stamps import record_compute, with_stamps
from shoal.errors import ErrorCode
from shoal.messages import BatchResult, Error, InferResponse, WrittenState

Outcome = tuple[RequestKey, bytes, InferResponse]  # request, its frontend, its answer


def batch_outcomes(runtime: ModelVersionRuntime, keys: list[RequestKey], message: BatchResult,
                   streams: set[int], now: float) -> list[Outcome]:
    """Record the execution and end each request of it that ended, in ``keys`` order. A
    decoupled request without a Result keeps answering: its execution id joins ``streams``
    (the worker's open streams)."""
    by_exec = {r.request_id: r for r in message.results}
    rows = sum(runtime.requests[k].request.batch_size for k in keys if k in runtime.requests)
    runtime.stats.record_execution(rows, len(keys), message.timings)
    outcomes: list[Outcome] = []
    succeeded: list[int] = []  # durations, recorded at once
    for key in keys:
        pending = runtime.requests.get(key)
        exec_id = pending.exec_id if pending is not None else 0
        result = by_exec.get(exec_id)
        if pending is not None and pending.trace is not None:
            record_compute(pending.trace, message.timings)
        if runtime.decoupled and result is None:
            if pending is not None:
                streams.add(exec_id)
            continue
        pending = runtime.forget(key)
        if pending is None:
            continue
        elapsed = int((now - pending.arrival) * 1e9)
        if result is None:
            error = Error(ErrorCode.INTERNAL, "worker returned no result for the request")
            response = InferResponse(key[1], error=error)
            runtime.stats.record_failure(elapsed, "BACKEND")
        elif result.error is not None:
            response = InferResponse(key[1], error=result.error)
            runtime.stats.record_failure(elapsed, "BACKEND")
        else:
            response = InferResponse(key[1], runtime.version, result.outputs, result.parameters,
                                     None, message.lease)
            succeeded.append(elapsed)
        if pending.trace is not None:
            response = with_stamps(response, pending)
        outcomes.append((key, pending.frontend, response))
    runtime.stats.record_successes(succeeded)
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
