"""Handing work to idle model instances (docs/architecture.md §5): each idle instance of a model
version gets its next ``Work`` from the version's ``RuntimeScheduling`` as one ``Batch``; with
``--rate-limit execution_count`` an instance with work is staged and starts when the rate
limiter grants it its resources. Owns the batch and execution id counters and the rate limiter.
The broker loop calls ``dispatch`` after anything that may have made work runnable; no I/O here
but the Batch sends.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from shoal.broker.health import note_progress
from shoal.broker.held_releases import HeldReleases
from shoal.broker.model_runtime import ModelVersionRuntime
from shoal.broker.pool import WorkerHandle, WorkerState
from shoal.broker.rate_limiter import RateLimiter
from shoal.broker.rate_limiter.placement import placed_needs
from shoal.broker.schedulers.base import RequestKey
from shoal.broker.worker_link import WorkerLink
from shoal.errors import ShoalError
from shoal.messages import Batch, Error, InlineTensor, StateBinding

logger = logging.getLogger(__name__)

# (runtime, request, error, failure reason, now): end a request with an error (the loop's)
FinishError = Callable[[ModelVersionRuntime, RequestKey, Error, str | None, float], None]


class Dispatcher:
    def __init__(self, workers: WorkerLink, held_releases: HeldReleases,
                 rate_limiter: RateLimiter | None, finish_error: FinishError) -> None:
        self.workers = workers
        self.held_releases = held_releases  # releases ride on the worker's next Batch
        self.rate_limiter = rate_limiter  # None: every idle instance starts at once
        self.finish_error = finish_error
        self.next_batch_id = 1
        self.next_exec_id = 1

    def dispatch(self, runtime: ModelVersionRuntime, now: float) -> None:
        """Give each idle instance its next work (the rate limiter decides whose turn it is
        when there is one)."""
        if self.rate_limiter is not None:
            self.dispatch_rate_limited(runtime, now)
            return
        scheduling = runtime.scheduling
        for index, slot in enumerate(runtime.instances):
            worker = slot.worker
            if worker is None or worker.state is not WorkerState.IDLE:
                continue
            if not self.run_work(runtime, index, worker, now) and not scheduling.per_instance:
                return  # one queue for all: nothing for this one is nothing for the rest

    def dispatch_rate_limited(self, runtime: ModelVersionRuntime, now: float) -> None:
        """Every idle instance with work ready waits for its turn (as Triton: staged only with
        a batch ready); then every instance (of any model) whose turn it is and whose
        resources are free starts its work."""
        assert self.rate_limiter is not None
        for index, slot in enumerate(runtime.instances):
            if (slot.worker is not None and slot.worker.state is WorkerState.IDLE
                    and runtime.scheduling.has_work(index, now)):
                self.rate_limiter.stage(slot.worker.identity, slot.device_id, slot.rate_needs)
        self.grant_rate_limited(now)

    def grant_rate_limited(self, now: float) -> None:
        assert self.rate_limiter is not None
        while self.rate_limiter.grant_next(lambda identity: self.start_granted(identity, now)):
            pass

    def start_granted(self, identity: str, now: float) -> bool:
        """The rate limiter granted this worker its resources: send it its work. False if it
        has nothing to run (or is no longer idle); the limiter then takes nothing."""
        entry = self.workers.entries.get(identity)
        if entry is None or entry[0].state is not WorkerState.IDLE:
            return False
        handle, runtime, slot = entry
        return self.run_work(runtime, runtime.instances.index(slot), handle, now)

    def run_work(self, runtime: ModelVersionRuntime, index: int, worker: WorkerHandle,
                 now: float) -> bool:
        """Send instance ``index``'s next work, if any; True if a batch was sent."""
        work = runtime.scheduling.work_for(index, self.next_batch_id, now)
        if work is None:
            return False
        if work.error is not None:
            error = Error(work.error.code, work.error.message)
            for key in work.keys:
                self.finish_error(runtime, key, error, "OTHER", now)
            return False
        self.send_batch(runtime, worker, work.keys, now, work.rows, work.controls, work.states)
        return True

    def send_batch(self, runtime: ModelVersionRuntime, worker: WorkerHandle,
                   keys: list[RequestKey], now: float, rows: list[int] | None = None,
                   controls: list[InlineTensor] | None = None,
                   states: Mapping[RequestKey, list[StateBinding]] | None = None) -> None:
        """Hand these queued requests to an idle worker as one Batch."""
        batch_id = self.next_batch_id
        self.next_batch_id += 1
        requests = runtime.start_batch(batch_id, keys, worker.identity, now, self.next_exec_id,
                                       states or {})
        self.next_exec_id += len(keys)
        worker.state, worker.batch_id = WorkerState.BUSY, batch_id
        note_progress(worker, now)
        self.workers.send(worker.identity, Batch(batch_id, requests, rows or [], controls or [],
                                                self.held_releases.take(worker.identity)))

    # ------------------------------------------------------------------ the rate limiter

    def batch_done(self, identity: str) -> None:
        """The worker's BatchResult came: the resources it held are free."""
        if self.rate_limiter is not None:
            self.rate_limiter.release(identity)

    def worker_gone(self, identity: str) -> None:
        """What a dead worker held is free (the next tick grants it again)."""
        if self.rate_limiter is not None:
            self.rate_limiter.forget(identity)

    def refresh_rate_limits(self, runtimes: Iterable[ModelVersionRuntime]) -> None:
        """The resources' copies follow the instances held (loads were checked, so this only
        fails on a broker bug: the old limits stay)."""
        if self.rate_limiter is None:
            return
        try:
            self.rate_limiter.set_instances(placed_needs(runtimes))
        except ShoalError as error:
            logger.error("rate limiter resources not updated: %s", error.message)
