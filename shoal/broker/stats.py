"""Per model-version statistics, in Triton's statistics-extension terms (durations in ns).

Counting rules (Triton 2.51, measured against it): ``execution_count`` and ``batch_stats`` count
executions, every one whatever became of its requests (``batch_stats`` by the rows it ran).
A request that succeeded counts in ``success``, ``queue`` and ``compute_*`` (each request
carrying its batch's compute durations) and its rows in ``inference_count``; one that failed
counts in ``fail`` (by reason) only. A request succeeded when the model executed it and
answered it, even with an error response (a python model's ``InferenceResponse(error=...)``,
outputs that did not fit a client region: ``Error.in_response``); it failed when it
timed out in its queue (REJECTED), was cancelled, or its execution failed (``execute`` raised,
the instance died). A request its scheduler refused on arrival (the queue is full, a sequence
request without START or correlation id) counts nowhere. A decoupled request succeeds when its
stream ends with anything but an execution failure.

An ensemble (core ``ensemble_scheduler.cc`` ``RequestTracker``, ``infer_stats.cc``) has no
executions of its own: each successful ensemble request counts as one execution of its batch
size, and its ``compute_*`` durations are the sums over the composing requests it made (each
carrying its batch's durations, as above); its queue is the time before the run began. A failed
one counts only in ``fail``. Its composing models count its step requests as any other.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from shoal.messages import (
    LATENCY_BUCKET_BOUNDS_US,
    BatchStat,
    BatchTimings,
    Duration,
    LatencyHistogram,
    ModelStats,
)


@dataclass
class _Acc:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def frozen(self) -> Duration:
        return Duration(self.count, self.ns)


@dataclass
class _Histogram:
    """Durations per LATENCY_BUCKET_BOUNDS_US bucket (one extra for those above the last)."""

    counts: list[int] = field(default_factory=list)

    def add(self, ns: int, count: int = 1) -> None:
        if not self.counts:
            self.counts = [0] * (len(LATENCY_BUCKET_BOUNDS_US) + 1)
        # bucket i holds durations in (bound[i-1], bound[i]] µs
        self.counts[bisect.bisect_left(LATENCY_BUCKET_BOUNDS_US, -(-ns // 1000))] += count

    def add_each(self, durations: list[int]) -> None:
        """``add(ns)`` for each of ``durations`` (one call per batch instead of per request)."""
        if not self.counts:
            self.counts = [0] * (len(LATENCY_BUCKET_BOUNDS_US) + 1)
        counts, bounds, bucket = self.counts, LATENCY_BUCKET_BOUNDS_US, bisect.bisect_left
        for ns in durations:
            counts[bucket(bounds, -(-ns // 1000))] += 1

    def frozen(self) -> LatencyHistogram:
        return LatencyHistogram(list(self.counts))


@dataclass
class _BatchAcc:
    compute_input: _Acc = field(default_factory=_Acc)
    compute_infer: _Acc = field(default_factory=_Acc)
    compute_output: _Acc = field(default_factory=_Acc)


@dataclass
class ModelVersionStats:
    name: str
    version: int
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: _Acc = field(default_factory=_Acc)
    fail: _Acc = field(default_factory=_Acc)
    queue: _Acc = field(default_factory=_Acc)
    compute_input: _Acc = field(default_factory=_Acc)
    compute_infer: _Acc = field(default_factory=_Acc)
    compute_output: _Acc = field(default_factory=_Acc)
    batches: dict[int, _BatchAcc] = field(default_factory=dict)
    fail_by_reason: dict[str, int] = field(default_factory=dict)
    request_latency: _Histogram = field(default_factory=_Histogram)
    queue_latency: _Histogram = field(default_factory=_Histogram)
    compute_latency: _Histogram = field(default_factory=_Histogram)
    first_response_latency: _Histogram = field(default_factory=_Histogram)
    first_response: _Acc = field(default_factory=_Acc)  # count and sum of the histogram above
    # per request, as the compute_* accumulators (Triton's compute summaries)
    compute_input_latency: _Histogram = field(default_factory=_Histogram)
    compute_infer_latency: _Histogram = field(default_factory=_Histogram)
    compute_output_latency: _Histogram = field(default_factory=_Histogram)
    cache_hit: _Acc = field(default_factory=_Acc)  # lookup + extract, per hit
    cache_miss: _Acc = field(default_factory=_Acc)  # lookup + insertion, per miss

    def record_cache(self, hits: int, hit_ns: int, misses: int, miss_ns: int) -> None:
        """Response-cache figures from a frontend. Triton's rules: a hit is a successful request
        (``success`` and ``queue`` count it, the latter with no wait) but no inference or
        execution; a miss is counted again as the request it executes."""
        if hits:
            self.cache_hit.add(hit_ns, hits)
            self.success.add(hit_ns, hits)
            self.queue.add(0, hits)
            self.last_inference_ms = int(time.time() * 1000)
        if misses:
            self.cache_miss.add(miss_ns, misses)

    def record_compute(self, timings: BatchTimings, requests: int = 1) -> None:
        """The compute durations of ``requests`` successful requests of one execution (each
        carries the execution's durations, Triton's rule)."""
        if not requests:
            return
        self.compute_latency.add(timings.compute_input_ns + timings.compute_infer_ns
                                 + timings.compute_output_ns, requests)
        self.compute_input.add(timings.compute_input_ns * requests, requests)
        self.compute_infer.add(timings.compute_infer_ns * requests, requests)
        self.compute_output.add(timings.compute_output_ns * requests, requests)
        self._count_compute_parts(timings, requests)

    def record_ensemble_success(self, batch_size: int, request_ns: int, queue_ns: int,
                                compute: BatchTimings) -> None:
        """One successful ensemble request of ``batch_size`` rows; ``compute``: the sums over
        the composing requests it made."""
        self.success.add(request_ns)
        self.request_latency.add(request_ns)
        self.queue.add(queue_ns)
        self.queue_latency.add(queue_ns)
        self.compute_latency.add(compute.compute_input_ns + compute.compute_infer_ns
                                 + compute.compute_output_ns)
        self.compute_input.add(compute.compute_input_ns)
        self.compute_infer.add(compute.compute_infer_ns)
        self.compute_output.add(compute.compute_output_ns)
        self._count_compute_parts(compute, 1)
        self.record_execution(max(1, batch_size), compute)
        self.inference_count += max(1, batch_size)

    def record_success(self, ns: int, queue_ns: int, rows: int) -> None:
        """One successful request of ``rows`` batch rows, ``ns`` from arrival to its end, of
        which ``queue_ns`` queued (its compute: ``record_compute``)."""
        self.success.add(ns)
        self.request_latency.add(ns)
        self.queue.add(queue_ns)
        self.queue_latency.add(queue_ns)
        self.inference_count += rows
        self.last_inference_ms = int(time.time() * 1000)

    def record_successes(self, durations: list[int], queued: list[int], rows: int) -> None:
        """``record_success`` for each of a batch's successful requests (``durations`` and
        ``queued`` in the same order; ``rows``: theirs in all), in one call."""
        if durations:
            self.success.add(sum(durations), len(durations))
            self.request_latency.add_each(durations)
            self.queue.add(sum(queued), len(queued))
            self.queue_latency.add_each(queued)
            self.inference_count += rows
            self.last_inference_ms = int(time.time() * 1000)

    def record_first_response(self, ns: int) -> None:
        """A decoupled request's first response (or its end, if it had none) ``ns`` after its
        arrival."""
        self.first_response_latency.add(ns)
        self.first_response.add(ns)

    def record_failure(self, ns: int, reason: str) -> None:
        """reason: REJECTED | CANCELED | BACKEND | OTHER (Triton's metric label)."""
        self.fail.add(ns)
        self.fail_by_reason[reason] = self.fail_by_reason.get(reason, 0) + 1

    def _count_compute_parts(self, timings: BatchTimings, requests: int) -> None:
        self.compute_input_latency.add(timings.compute_input_ns, requests)
        self.compute_infer_latency.add(timings.compute_infer_ns, requests)
        self.compute_output_latency.add(timings.compute_output_ns, requests)

    def record_execution(self, rows: int, timings: BatchTimings) -> None:
        """One execution of ``rows`` batch rows, whatever became of its requests."""
        self.execution_count += 1
        self.last_inference_ms = int(time.time() * 1000)
        acc = self.batches.setdefault(rows, _BatchAcc())
        acc.compute_input.add(timings.compute_input_ns)
        acc.compute_infer.add(timings.compute_infer_ns)
        acc.compute_output.add(timings.compute_output_ns)

    def snapshot(self, pending: int, in_flight: int = 0,
                 instance_restarts: dict[str, int] | None = None) -> ModelStats:
        return ModelStats(
            name=self.name, version=self.version, last_inference_ms=self.last_inference_ms,
            inference_count=self.inference_count, execution_count=self.execution_count,
            success=self.success.frozen(), fail=self.fail.frozen(), queue=self.queue.frozen(),
            compute_input=self.compute_input.frozen(), compute_infer=self.compute_infer.frozen(),
            compute_output=self.compute_output.frozen(),
            batch_stats=[
                BatchStat(size, acc.compute_input.frozen(), acc.compute_infer.frozen(),
                          acc.compute_output.frozen())
                for size, acc in sorted(self.batches.items())
            ],
            pending=pending, fail_by_reason=dict(self.fail_by_reason),
            in_flight=in_flight, request_latency=self.request_latency.frozen(),
            queue_latency=self.queue_latency.frozen(),
            compute_latency=self.compute_latency.frozen(),
            first_response_latency=self.first_response_latency.frozen(),
            instance_restarts=dict(instance_restarts or {}),
            compute_input_latency=self.compute_input_latency.frozen(),
            compute_infer_latency=self.compute_infer_latency.frozen(),
            compute_output_latency=self.compute_output_latency.frozen(),
            first_response=self.first_response.frozen(),
            cache_hit=self.cache_hit.frozen(), cache_miss=self.cache_miss.frozen(),
        )
