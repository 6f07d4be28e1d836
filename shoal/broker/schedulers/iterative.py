"""Triton's iterative sequences (``sequence_batching { iterative_sequence: true }``): each request
is a sequence of its own, which the model may run over several executions. A model releases a
request with ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` to have it executed again; the request
then waits, pinned to the instance that ran it (the model keeps its progress there), and goes
first into that instance's next batch, which new requests fill up to ``max_batch_size`` rows
(in-flight batching: a batch mixes requests at different iterations).

New requests queue first in, first out, with no priority levels or queue timeouts (Triton's
sequence batcher has no queue policy); requests batch together only when their
``shape_signature`` matches. Rescheduled requests are the broker's running requests, not queued
ones: ``cancel`` and ``pending_*`` see only the new ones; ``take_rescheduled`` gives an instance's
back when it died, ``drain`` every request (unload, shutdown). Implements ``Scheduler`` and adds
the per-instance calls the broker uses for these models.
"""

from __future__ import annotations

from collections import deque

from shoal.broker.schedulers.base import QueuedRequest, Rejection, RequestKey


class IterativeScheduler:
    def __init__(self, max_batch_size: int) -> None:
        self._max_rows = max(1, max_batch_size)
        self._fifo: deque[QueuedRequest] = deque()
        self._by_key: dict[RequestKey, QueuedRequest] = {}
        self._rows = 0
        self._rescheduled: dict[int, list[QueuedRequest]] = {}  # instance index -> requests

    # ------------------------------------------------------------------ the Scheduler protocol

    def submit(self, request: QueuedRequest, now: float) -> Rejection | None:
        if request.key in self._by_key:
            raise ValueError(f"request {request.key!r} is already queued")
        self._fifo.append(request)
        self._by_key[request.key] = request
        self._rows += request.rows
        return None

    def next_batch(self, now: float) -> list[QueuedRequest] | None:
        """A batch of new requests only (an instance with nothing rescheduled)."""
        return self.next_batch_for(-1, now)

    def has_batch(self, now: float) -> bool:
        return bool(self._fifo)

    def expire(self, now: float) -> list[Rejection]:
        return []

    def next_deadline(self, now: float) -> float | None:
        return None

    def cancel(self, key: RequestKey) -> QueuedRequest | None:
        """A new request still queued; None for any other (a rescheduled one is running)."""
        request = self._by_key.pop(key, None)
        if request is None:
            return None
        self._fifo.remove(request)
        self._rows -= request.rows
        return request

    def drain(self) -> list[QueuedRequest]:
        """Every request waiting here: the rescheduled ones first, then the new ones."""
        drained = [r for waiting in self._rescheduled.values() for r in waiting]
        drained += self._fifo
        self._rescheduled.clear()
        self._fifo.clear()
        self._by_key.clear()
        self._rows = 0
        return drained

    def pending_count(self) -> int:
        return len(self._fifo)

    def pending_rows(self) -> int:
        return self._rows

    # ------------------------------------------------------------------ per instance

    def reschedule(self, instance: int, requests: list[QueuedRequest]) -> None:
        """Instance ``instance`` released these with RESCHEDULE: they go first into its next
        batch, in this order."""
        if requests:
            self._rescheduled.setdefault(instance, []).extend(requests)

    def has_batch_for(self, instance: int) -> bool:
        return bool(self._fifo) or bool(self._rescheduled.get(instance))

    def next_batch_for(self, instance: int, now: float) -> list[QueuedRequest] | None:
        """The next batch of instance ``instance``: its rescheduled requests (all of them, even
        past ``max_batch_size``: they ran together already), then new requests of the same
        shape signature while their rows fit. None when it has nothing to run."""
        batch = self._rescheduled.pop(instance, [])
        rows = sum(r.rows for r in batch)
        signature = batch[0].shape_signature if batch else None
        while self._fifo and rows + self._fifo[0].rows <= self._max_rows:
            request = self._fifo[0]
            if signature is not None and request.shape_signature != signature:
                break
            signature = request.shape_signature
            self._fifo.popleft()
            del self._by_key[request.key]
            self._rows -= request.rows
            batch.append(request)
            rows += request.rows
        return batch or None

    def take_rescheduled(self, instance: int) -> list[QueuedRequest]:
        """Instance ``instance`` died: the requests that waited for it (their progress died
        with it)."""
        return self._rescheduled.pop(instance, [])
