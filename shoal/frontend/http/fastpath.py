"""A plain-ASGI front for the HTTP app: ``POST .../infer`` goes straight to the infer endpoint,
everything else to the Starlette app. In the server, infer requests do not reach it: the
connection's protocol serves them (``lean.py``, through ``lean_infer``); this path serves them
under any other ASGI server (the in-process test clients) with the same handler.

The infer route is the hot path; Starlette's middleware stack and router cost more per request
than the rest of the frontend's Python work for a small model (profiled: bench/RESULTS.md). The
endpoint is the same guarded InferHandler the router uses, so behaviour and errors are identical;
only the dispatch is shorter. Matching follows Triton's route regex for infer.

Client disconnects: once the body is read, the handler runs as a task while we keep listening on
``receive``; if the client goes away before the answer, the task is cancelled, which cancels the
request at the broker (dropped if still queued: Triton does not do this; we do).

Tracing: the infer path is where a request is sampled (``Tracer.sample`` with the URL's model:
one counter increment when it is not traced). A traced request is stamped HTTP_RECV_START on
arrival, HTTP_RECV_END once its body is read, HTTP_SEND_START / HTTP_SEND_END around the
answer's send; the handler finds it in the scope (``TRACE_SCOPE_KEY``), and it is handed to the
tracer's writer when the exchange is over, however it ended.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shoal.frontend.http.compression import size_limit_error
from shoal.frontend.http.endpoint import Endpoint
from shoal.frontend.http.errors import shoal_error_response
from shoal.frontend.http.infer import INFER_PATH, TRACE_SCOPE_KEY
from shoal.frontend.http.restricted import HttpGate
from shoal.trace.record import (
    HTTP_RECV_END,
    HTTP_RECV_START,
    HTTP_SEND_END,
    HTTP_SEND_START,
    RequestTrace,
)

if TYPE_CHECKING:
    from shoal.frontend.http.lean import LeanInfer
    from shoal.trace.sampling import Tracer



class InferFastPath:
    """``gate``: the infer route's restricted-API gate (``ApiRoute.gate``, None when
    ``inference`` is not restricted), checked before the body is read, as the route would."""

    def __init__(self, app: ASGIApp, infer: Endpoint, max_body: int,
                 gate: HttpGate | None = None, tracer: Tracer | None = None) -> None:
        self._app = app
        self._infer = infer
        self._max_body = max_body
        self._gate = gate
        self._tracer = tracer
        # set by ``create_asgi_app``: the protocol serves infer itself (``lean.py``); this ASGI
        # path then serves infer only for servers without ``GuardedHttpProtocol`` (tests)
        self.lean_infer: LeanInfer | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = INFER_PATH.match(scope["path"])
            if match is not None:
                model, version = match.groups()
                path_params = {"model": model}
                if version is not None:
                    path_params["version"] = version
                scope["path_params"] = path_params
                await self._serve_infer(scope, receive, send, model)
                return
        await self._app(scope, receive, send)

    async def _serve_infer(self, scope: Scope, receive: Receive, send: Send, model: str) -> None:
        if self._gate is not None:
            refused = self._gate.refusal(scope)
            if refused is not None:
                await refused(scope, receive, send)
                return
        trace = self._tracer.sample(model) if self._tracer is not None else None
        if trace is None:
            await self._serve_admitted(scope, receive, send)
            return
        trace.stamp(HTTP_RECV_START)
        scope[TRACE_SCOPE_KEY] = trace
        try:
            await self._serve_admitted(scope, receive, send, trace)
        finally:
            assert self._tracer is not None
            self._tracer.finish(trace)

    async def _serve_admitted(self, scope: Scope, receive: Receive, send: Send,
                              trace: RequestTrace | None = None) -> None:
        body_messages: list[Message] = []
        size = 0
        while True:  # the body first, never more than the limit
            message = await receive()
            size += len(message.get("body", b""))
            if size > self._max_body:
                error = shoal_error_response(size_limit_error(size, self._max_body))
                await error(scope, receive, send)
                return
            body_messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        if body_messages[-1]["type"] == "http.disconnect":
            return
        if trace is not None:
            trace.stamp(HTTP_RECV_END)
        replay = iter(body_messages)

        async def replay_receive() -> Message:
            return next(replay, {"type": "http.disconnect"})

        # One watcher task per request (cheap): if the client disconnects before we answer, it
        # cancels this task, which cancels the request at the broker.
        this_task = asyncio.current_task()
        assert this_task is not None
        left = False

        async def watch() -> None:
            nonlocal left
            if (await receive())["type"] == "http.disconnect":
                left = True
                this_task.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            response = await self._infer(Request(scope, replay_receive))
        except asyncio.CancelledError:
            if not left:
                raise
            this_task.uncancel()
            return
        finally:
            watcher.cancel()
        if trace is not None:
            trace.stamp(HTTP_SEND_START)
            await response(scope, receive, send)
            trace.stamp(HTTP_SEND_END)
            return
        await response(scope, receive, send)
