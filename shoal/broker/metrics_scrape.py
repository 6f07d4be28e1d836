"""Scrapes of ``/metrics`` that wait for the workers' current custom metrics.

A model may set a custom metric and read ``/metrics`` in the same ``execute`` (Triton's QA
model does): the value must be there, not on the worker's next heartbeat. So a scrape asks
every serving worker's control thread, which answers while the model runs, for its metrics
now (``CollectCustomMetrics`` -> ``CustomMetricsSnapshot``), and is answered when the last of
them replied or after ``wait_s``, whichever is first; a worker that did not answer in time
counts with its last heartbeat's set. The broker owns one of these; it never blocks on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

WAIT_S: Final = 0.25  # a worker slower than this to answer counts with its heartbeat's set


@dataclass
class Scrape:
    """One frontend's metrics query, waiting for ``waiting`` (worker identities)."""

    frontend: bytes
    query_id: int
    deadline: float
    waiting: set[str] = field(default_factory=set)


class MetricsScrapes:
    def __init__(self, wait_s: float = WAIT_S) -> None:
        self.wait_s = wait_s
        self._pending: dict[int, Scrape] = {}
        self._next_token = 1

    def start(self, frontend: bytes, query_id: int, workers: list[str], now: float
              ) -> tuple[int, Scrape]:
        """A scrape waiting for ``workers``; its token goes in each ``CollectCustomMetrics``.
        With no workers it is done at once (the caller answers it without asking)."""
        token = self._next_token
        self._next_token += 1
        scrape = Scrape(frontend, query_id, now + self.wait_s, set(workers))
        if scrape.waiting:
            self._pending[token] = scrape
        return token, scrape

    def answered(self, token: int, worker: str) -> Scrape | None:
        """Worker ``worker`` answered scrape ``token``: the scrape, if that was its last."""
        scrape = self._pending.get(token)
        if scrape is None:
            return None  # answered late: the scrape went out on its deadline
        scrape.waiting.discard(worker)
        if scrape.waiting:
            return None
        del self._pending[token]
        return scrape

    def worker_gone(self, worker: str) -> list[Scrape]:
        """A worker died or stopped: nobody waits for it; the scrapes that leaves done."""
        done = []
        for token, scrape in list(self._pending.items()):
            scrape.waiting.discard(worker)
            if not scrape.waiting:
                del self._pending[token]
                done.append(scrape)
        return done

    def expired(self, now: float) -> list[Scrape]:
        """The scrapes whose time is up (answered with the sets the broker has)."""
        done = [token for token, scrape in self._pending.items() if scrape.deadline <= now]
        return [self._pending.pop(token) for token in done]

    def next_deadline(self) -> float | None:
        return min((scrape.deadline for scrape in self._pending.values()), default=None)
