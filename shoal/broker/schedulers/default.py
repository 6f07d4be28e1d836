"""Triton's default scheduler: first in, first out, one request per execution.

Priority and the request ``timeout`` parameter are not applied (Triton applies both only through
the dynamic batcher's queue policy), so nothing here depends on the clock.
"""

from __future__ import annotations

from collections import deque

from shoal.broker.schedulers.base import QueuedRequest, Rejection, RequestKey


class DefaultScheduler:
    """Implements ``Scheduler``. Unbounded: admission limits for models without a dynamic
    batcher are the broker's (Triton has none either)."""

    def __init__(self) -> None:
        self._fifo: deque[QueuedRequest] = deque()
        self._by_key: dict[RequestKey, QueuedRequest] = {}
        self._rows = 0

    def submit(self, request: QueuedRequest, now: float) -> Rejection | None:
        if request.key in self._by_key:
            raise ValueError(f"request {request.key!r} is already queued")
        self._fifo.append(request)
        self._by_key[request.key] = request
        self._rows += request.rows
        return None

    def next_batch(self, now: float) -> list[QueuedRequest] | None:
        if not self._fifo:
            return None
        request = self._fifo.popleft()
        self._forget(request)
        return [request]

    def has_batch(self, now: float) -> bool:
        return bool(self._fifo)

    def expire(self, now: float) -> list[Rejection]:
        return []

    def next_deadline(self, now: float) -> float | None:
        return None

    def cancel(self, key: RequestKey) -> QueuedRequest | None:
        request = self._by_key.get(key)
        if request is None:
            return None
        self._fifo.remove(request)
        self._forget(request)
        return request

    def drain(self) -> list[QueuedRequest]:
        drained = list(self._fifo)
        self._fifo.clear()
        self._by_key.clear()
        self._rows = 0
        return drained

    def pending_count(self) -> int:
        return len(self._fifo)

    def pending_rows(self) -> int:
        return self._rows

    def _forget(self, request: QueuedRequest) -> None:
        del self._by_key[request.key]
        self._rows -= request.rows
