"""A decoupled python model's ``execute`` (docs/architecture.md §7, the python backend).

Responses travel through each request's sender (now or later, any thread); ``execute`` itself
answers nothing, except an error for the requests whose sender is still open when the model
raised or returned anything but None (as Triton's python backend: a decoupled execute must
return None, and the client must not wait for ever).

An ``async def execute`` is not waited for (as Triton's stub): the coroutine runs on the
model's event loop (``async_runner.AsyncRunner``) in the background and the instance takes its
next requests at once, so several executes overlap while they await; when one ends with an
exception (or a return value) it is logged and the requests still open get the error through
the worker's response sink (on the loop's thread), their senders closed first.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from typing import Any

from shoal.errors import ShoalError
from shoal.messages import Error
from shoal.workers.backends.base import BackendRequest, ResponseSink
from shoal.workers.backends.python.async_runner import AsyncRunner
from shoal.workers.backends.python.pb_request import InferenceRequest
from shoal.workers.backends.python.returned import execute_failed, returned_not_none


def execute_decoupled(model: Any, requests: list[BackendRequest],
                      pb_requests: list[InferenceRequest], *, runner: AsyncRunner,
                      sink: ResponseSink | None, instance: str) -> list[Error | None]:
    """Calls ``model.execute(pb_requests)``; per request, the error it gets now, or None (its
    sender answers, or has answered)."""
    try:
        returned = model.execute(pb_requests)
        if asyncio.iscoroutine(returned):
            runner.submit(returned, lambda outcome: _background_done(
                outcome, requests, pb_requests, sink, instance))
            return [None] * len(requests)
    except Exception as exc:
        error = execute_failed(instance, exc, len(requests))
    else:
        if returned is None:
            return [None] * len(requests)
        error = returned_not_none(instance, returned)
    return [None if (p._sender is not None and p._sender.closed) else error
            for p in pb_requests]


def _background_done(outcome: concurrent.futures.Future[Any], requests: list[BackendRequest],
                     pb_requests: list[InferenceRequest], sink: ResponseSink | None,
                     instance: str) -> None:
    """A background decoupled execute ended (on the event loop's thread)."""
    if outcome.cancelled():
        return  # the loop was closed at unload
    exc = outcome.exception()
    if exc is not None:
        error = execute_failed(instance, exc, len(requests))
    elif outcome.result() is not None:
        error = returned_not_none(instance, outcome.result())
    else:
        return
    if sink is None:
        return
    for request, pb_request in zip(requests, pb_requests, strict=True):
        sender = pb_request.get_response_sender()
        if sender.closed:
            continue
        sender._closed = True
        # already ended (answered by another thread meanwhile): nothing to do
        with contextlib.suppress(ShoalError):
            sink(request.request_id, error, True)
