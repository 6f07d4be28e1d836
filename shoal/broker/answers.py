"""How terminal answers leave the broker (docs/architecture.md §4): queued on the frontend link
to go out at the end of the loop pass, through the version's response orderer when the model
has ``preserve_ordering``; and a request ended with an error, its failure counted (or not, for
a request refused on arrival) and its trace stamps attached.
"""

from __future__ import annotations

from shoal.broker.frontend_link import FrontendLink
from shoal.broker.model_runtime import ModelVersionRuntime
from shoal.broker.schedulers.base import RequestKey
from shoal.broker.trace_stamps import with_stamps
from shoal.messages import Error, InferResponse


class Answers:
    def __init__(self, frontends: FrontendLink) -> None:
        self.frontends = frontends

    def answer(self, identity: bytes, response: InferResponse) -> None:
        """Queue a terminal answer; the loop flushes them at the end of its pass."""
        self.frontends.answer(identity, response)

    def deliver(self, runtime: ModelVersionRuntime, key: RequestKey, frontend: bytes,
                response: InferResponse) -> None:
        """An executed request's answer, held back until those before it are answered when
        the model preserves ordering."""
        if runtime.orderer is None:
            self.frontends.answer(frontend, response)
            return
        for ready_key, ready in runtime.orderer.complete(key, response):
            self.frontends.answer(ready_key[0], ready)

    def finish_error(self, runtime: ModelVersionRuntime, key: RequestKey, error: Error,
                     reason: str | None, now: float) -> None:
        """End the request with ``error``, a failure counted under ``reason`` (None: not
        counted, a request its scheduler refused on arrival)."""
        pending = runtime.forget(key)
        if pending is None:
            return
        if reason is not None:
            runtime.stats.record_failure(int((now - pending.arrival) * 1e9), reason)
        response = InferResponse(key[1], error=error)
        if pending.trace is not None:
            response = with_stamps(response, pending.trace)
        if runtime.orderer is not None and pending.dispatched:
            self.deliver(runtime, key, pending.frontend, response)
        else:
            self.frontends.answer(pending.frontend, response)
