"""Requests arriving at the broker (docs/architecture.md §4): from the frontends, and from ensemble
runs (their steps, under the internal identity). Each is queued on its model version's
scheduling, handed to the ensemble driver for an ensemble, or answered at once when nothing
serves it (UNAVAILABLE) or its scheduling refuses it. Cancellation drops a queued request, or
tells the worker running it; a dead frontend's requests are all cancelled. The loop dispatches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shoal.broker.dispatcher import FinishError
from shoal.broker.ensemble.driver import EnsembleDriver
from shoal.broker.model_runtime import ModelVersionRuntime
from shoal.broker.models import ModelManager
from shoal.broker.schedulers.base import RequestKey
from shoal.broker.worker_link import CONTROL_SUFFIX, WorkerLink
from shoal.errors import ErrorCode
from shoal.messages import CancelExecuting, Error, InferRequest, InferResponse

logger = logging.getLogger(__name__)


class RequestIntake:
    def __init__(self, models: ModelManager, workers: WorkerLink,
                 answer: Callable[[bytes, InferResponse], None], finish_error: FinishError,
                 dispatch: Callable[[ModelVersionRuntime, float], None]) -> None:
        self.models = models
        self.workers = workers
        self.answer = answer
        self.finish_error = finish_error
        self.dispatch = dispatch
        self.stopping = False  # the server exits: every request is refused
        # set once the ensemble driver exists (it submits its steps and cancels through here)
        self.ensembles: EnsembleDriver | None = None

    def submit(self, identity: bytes, request: InferRequest, now: float) -> None:
        """Queue a request and dispatch at once (an ensemble's steps: no tick follows them)."""
        runtime = self.enqueue(identity, request, now)
        if runtime is not None:
            self.dispatch(runtime, now)

    def enqueue(self, identity: bytes, request: InferRequest, now: float
                ) -> ModelVersionRuntime | None:
        """Queue a request without dispatching; returns the model version whose queue it joined
        (None: it was answered at once, or an ensemble run took it)."""
        runtime = self.models.runtime(request.model, request.version)
        if runtime is None or self.stopping or not runtime.serving():
            reason = ("Server exiting" if self.stopping else
                      f"model '{request.model}' version {request.version} is not available")
            self.answer(identity, InferResponse(
                request.request_id, error=Error(ErrorCode.UNAVAILABLE, reason)))
            return None
        if request.timeout_us and logger.isEnabledFor(logging.DEBUG):
            # Triton's core logs a request's timeout at --log-verbose 1 (its QA greps for it)
            logger.debug("model '%s' request %s: Request timeout: %d", request.model,
                         request.client_request_id or request.request_id, request.timeout_us)
        if runtime.ensemble is not None:
            assert self.ensembles is not None
            self.ensembles.start(identity, request, runtime, now)
            return None
        key: RequestKey = (identity, request.request_id)
        queued = runtime.queued(key, identity, request, now)
        rejection = runtime.scheduling.submit(key, request, queued, now)
        if rejection is not None:  # refused on arrival: Triton counts it nowhere (stats.py)
            self.finish_error(runtime, key, Error(rejection.code, rejection.message), None, now)
            return None
        return runtime

    def cancel(self, identity: bytes, request_id: int, now: float) -> None:
        """Queued: dropped at once (never reaches a batch). Running: the worker is told, the
        model sees is_cancelled(); its answer still ends the request."""
        if self.ensembles is not None and self.ensembles.cancel(identity, request_id, now):
            return
        key: RequestKey = (identity, request_id)
        for runtime in self.models.runtimes():
            pending = runtime.requests.get(key)
            if pending is None:
                continue
            ended = runtime.scheduling.cancel(key, now) if not pending.worker else []
            if ended:  # queued (a sequence's queued rest may end with it)
                for end in ended:
                    self.finish_error(runtime, end, Error(ErrorCode.CANCELLED,
                                                          "request cancelled"), "CANCELED", now)
            elif pending.worker:  # running, or waiting to run again (rescheduled)
                self.workers.send(pending.worker + CONTROL_SUFFIX,
                                  CancelExecuting([pending.exec_id]))
            return

    def abandon(self, identity: bytes, now: float) -> None:
        """A frontend died and its successor said Hello: its requests still queued are dropped
        and its running ones are told they are cancelled (nobody can take their answers)."""
        mine = [key[1] for r in self.models.runtimes() for key in r.requests if key[0] == identity]
        if self.ensembles is not None:
            mine += self.ensembles.requests_of(identity)
        for request_id in mine:
            self.cancel(identity, request_id, now)
        if mine:
            logger.warning("dropped or cancelled %d requests of a frontend that died",
                           len(mine))
