"""The broker's part of a traced request (``InferRequest.trace``): Triton's QUEUE_START when it is
queued, COMPUTE_START when its batch leaves for a worker, the worker's compute phases from the
batch's ``BatchTimings``; they travel back in the terminal answer (``InferResponse.trace``).
Untraced requests never get here (``PendingRequest.trace`` is None). Times are
``time.monotonic_ns`` (CLOCK_MONOTONIC, the clock of every process).
"""

from __future__ import annotations

import time

import msgspec

from shoal.messages import BatchTimings, InferResponse, TraceStamps

QUEUE_START, COMPUTE_START, INPUT_END, OUTPUT_START, COMPUTE_END = range(5)


def queued_stamps() -> list[int]:
    """A traced request's stamps as it is queued (now: QUEUE_START)."""
    return [time.monotonic_ns(), 0, 0, 0, 0]


def record_compute(stamps: list[int], timings: BatchTimings) -> None:
    """The worker's phases of the request's batch (absolute, from the batch's start)."""
    if timings.start_ns:
        input_end = timings.start_ns + timings.compute_input_ns
        output_start = input_end + timings.compute_infer_ns
        stamps[INPUT_END] = input_end
        stamps[OUTPUT_START] = output_start
        stamps[COMPUTE_END] = output_start + timings.compute_output_ns


def with_stamps(response: InferResponse, stamps: list[int]) -> InferResponse:
    """``response`` carrying a traced request's ``stamps`` (its ``PendingRequest.trace``)."""
    return msgspec.structs.replace(response, trace=TraceStamps(*stamps))
