"""What a decoupled model's ``StreamResponse`` means for its request (docs/architecture.md §4):
the answer to forward (``stream_answer``), the first-response time, and at the final response
the request's end and its statistics (``count_stream_end``). No sockets: the loop sends what
these return.
"""

from __future__ import annotations

from shoal.broker.health import note_progress
from shoal.broker.model_runtime import ModelVersionRuntime, PendingRequest
from shoal.broker.pool import WorkerHandle
from shoal.broker.trace_stamps import with_stamps
from shoal.messages import Error, InferResponse, Lease, StreamResponse

StreamOutcome = tuple[bytes, InferResponse] | Lease | None  # (frontend, answer) / memory back


def stream_answer(handle: WorkerHandle, runtime: ModelVersionRuntime, message: StreamResponse,
                  now: float) -> StreamOutcome:
    """One response of a decoupled request: the frontend and the answer to send it, or, for a
    request already ended (e.g. failed), the response's lease to give back (None: nothing)."""
    key = runtime.by_exec.get(message.request_id)
    pending = runtime.requests.get(key) if key is not None else None
    if message.final:
        handle.streams.discard(message.request_id)
    note_progress(handle, now)
    if key is None or pending is None:
        return message.lease
    response = InferResponse(key[1], runtime.version, message.outputs, message.parameters,
                             message.error, message.lease, message.final, message.empty)
    if message.final and pending.trace is not None:
        response = with_stamps(response, pending.trace)
    if not pending.responded:
        pending.responded = True
        runtime.stats.record_first_response(int((now - pending.arrival) * 1e9))
    if message.final:
        runtime.forget(key)
        count_stream_end(runtime, pending, message.error, now)
    return pending.frontend, response


def count_stream_end(runtime: ModelVersionRuntime, pending: PendingRequest,
                     error: Error | None, now: float) -> None:
    """A decoupled request's stream ended with ``error`` (its final response's): a success
    unless its execution failed (stats.py). Its compute durations are the batch's, known
    already (``pending.compute``) or counted when the BatchResult comes."""
    elapsed = int((now - pending.arrival) * 1e9)
    if error is not None and not error.in_response:
        runtime.stats.record_failure(elapsed, "BACKEND")
        return
    runtime.stats.record_success(elapsed, pending.queued_ns, pending.request.batch_size)
    if pending.compute is not None:
        runtime.stats.record_compute(pending.compute)
    elif pending.batch_id in runtime.batches:
        runtime.early_successes[pending.batch_id] = \
            runtime.early_successes.get(pending.batch_id, 0) + 1
