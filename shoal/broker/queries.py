"""Answering the frontends' statistics queries (docs/architecture.md §8): ``StatsRequest`` ->
``StatsReply`` with the model versions' statistics and, for an all-models query, the device
ledger and the models' custom metrics. A ``/metrics`` scrape first asks every serving worker for
its custom metrics as they are now (``metrics_scrape.py``) and is answered when they replied
or on its deadline. The response cache's figures from the frontends are recorded here too.
The loop owns one ``StatsDesk``; it never blocks.
"""

from __future__ import annotations

from collections.abc import Callable

from shoal.broker.custom_metrics import merge_custom_metrics
from shoal.broker.frontend_link import FrontendLink
from shoal.broker.lifecycle.device_ledger import DeviceLedger, device_memory
from shoal.broker.metrics_scrape import MetricsScrapes, Scrape
from shoal.broker.model_runtime import ModelVersionRuntime
from shoal.broker.models import ModelManager
from shoal.broker.pool import WorkerState
from shoal.broker.worker_link import WorkerLink
from shoal.messages import (
    CacheFigures,
    CollectCustomMetrics,
    CustomMetricFamily,
    CustomMetricsSnapshot,
    StatsReply,
    StatsRequest,
)


class StatsDesk:
    def __init__(self, models: ModelManager, workers: WorkerLink, frontends: FrontendLink,
                 ensemble_pending: Callable[[ModelVersionRuntime], int],
                 ledger: DeviceLedger) -> None:
        """``ensemble_pending``: an ensemble's unanswered requests (the ensemble driver's);
        ``ledger``: the lifecycle's device ledger."""
        self.models = models
        self.workers = workers
        self.frontends = frontends
        self.ensemble_pending = ensemble_pending
        self.ledger = ledger
        self.scrapes = MetricsScrapes()  # /metrics scrapes waiting for workers' custom metrics

    def on_request(self, identity: bytes, message: StatsRequest, now: float) -> None:
        if message.custom_metrics and not message.model:
            self.start_scrape(identity, message.query_id, now)
        else:
            self.answer(identity, message.query_id, message.model, message.version)

    def answer(self, identity: bytes, query_id: int, model: str = "", version: int = -1
               ) -> None:
        models = self.models.stats(model, version, self.ensemble_pending)
        custom = [] if model else self.custom_metrics()
        devices = [] if model else device_memory(self.ledger)
        self.frontends.send(identity, StatsReply(query_id, models, custom_metrics=custom,
                                                 devices=devices))

    def start_scrape(self, identity: bytes, query_id: int, now: float) -> None:
        """A ``/metrics`` scrape: ask the serving workers for their custom metrics now; it is
        answered when they all replied or on its deadline (``metrics_scrape``)."""
        serving = [handle.identity for handle, _, _ in self.workers.entries.values()
                   if handle.state in (WorkerState.IDLE, WorkerState.BUSY)]
        token, scrape = self.scrapes.start(identity, query_id, serving, now)
        for worker in scrape.waiting:
            self.workers.send_control(worker, CollectCustomMetrics(token))
        if not scrape.waiting:
            self.answer(identity, query_id)

    def on_snapshot(self, worker: str, message: CustomMetricsSnapshot) -> None:
        """A worker's answer to a scrape (the loop stored its metrics on its handle first)."""
        done = self.scrapes.answered(message.token, worker)
        if done is not None:
            self.answer_scrapes([done])

    def worker_gone(self, worker: str) -> None:
        self.answer_scrapes(self.scrapes.worker_gone(worker))

    def expire(self, now: float) -> None:
        self.answer_scrapes(self.scrapes.expired(now))

    def next_deadline(self) -> float | None:
        return self.scrapes.next_deadline()

    def answer_scrapes(self, scrapes: list[Scrape]) -> None:
        for scrape in scrapes:
            self.answer(scrape.frontend, scrape.query_id)

    def record_cache_figures(self, message: CacheFigures) -> None:
        """A frontend's response-cache hits and misses join the serving versions' statistics
        (figures of a version no longer served are dropped)."""
        for figures in message.figures:
            runtime = self.models.runtime(figures.model, figures.version)
            if runtime is not None:
                runtime.stats.record_cache(figures.hits, figures.hit_ns, figures.misses,
                                           figures.miss_ns)

    def custom_metrics(self) -> list[CustomMetricFamily]:
        """The models' custom metrics over the workers still serving (an unloading model's go
        at once, a dead worker's with it)."""
        return merge_custom_metrics(
            handle.custom_metrics for handle, _, _ in
            sorted(self.workers.entries.values(), key=lambda entry: entry[0].identity)
            if handle.state not in (WorkerState.STOPPING, WorkerState.DEAD))
