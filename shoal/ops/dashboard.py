"""The ops dashboard's routes on the metrics port, every one under ``/dashboard`` (the
restricted-API category ``dashboard`` covers them all):

- ``GET /dashboard`` (and ``/dashboard/``): the page (``static/dashboard.html``);
- ``GET /dashboard/dashboard.js``: its script;
- ``GET /dashboard/api/stats``: the latest ``StatsDocument`` (schema.py) as JSON;
- ``GET /dashboard/api/history[?seconds=N]``: the ``HistoryDocument`` (last N ≤ 600 s);
- ``GET /dashboard/api/stream``: server-sent events, one ``stats`` event per sample.

Every handler hands out what the sampler already built; nothing is computed per request beyond
slicing the history. Errors are ``{"error": "..."}`` with a 4xx/5xx status.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from importlib import resources
from typing import Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from shoal.ops.sampler import HISTORY_S, Sampler, SubscriberLimit

SSE_RETRY_MS: Final = 2000  # the browser reconnects this long after the feed ends
_NO_STORE: Final = {"Cache-Control": "no-store"}
_PAGE_HEADERS: Final = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; "
                               "style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'",
}


def _static(name: str) -> bytes:
    return resources.files("shoal.ops").joinpath("static", name).read_bytes()


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status, headers=_NO_STORE)


def parse_seconds(text: str | None) -> float | None:
    """The ``seconds`` query parameter: None (all history) or 1..HISTORY_S; ValueError with
    the message for the client otherwise."""
    if text is None:
        return None
    limit = int(HISTORY_S)
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 1 <= value <= limit:
        raise ValueError(f"seconds: expected an integer from 1 to {limit}, got '{text[:40]}'")
    return float(value)


def dashboard_routes(sampler: Sampler) -> list[BaseRoute]:
    """The routes, reading ``sampler``'s latest results."""
    page, script = _static("dashboard.html"), _static("dashboard.js")

    async def show_page(request: Request) -> Response:
        return Response(page, media_type="text/html; charset=utf-8", headers=_PAGE_HEADERS)

    async def show_script(request: Request) -> Response:
        return Response(script, media_type="text/javascript; charset=utf-8",
                        headers=_PAGE_HEADERS)

    async def stats(request: Request) -> Response:
        if not sampler.latest_json:
            return _error(503, "no sample yet: the sampler takes its first within a second")
        return Response(sampler.latest_json, media_type="application/json",
                        headers=_NO_STORE)

    async def history(request: Request) -> Response:
        try:
            seconds = parse_seconds(request.query_params.get("seconds"))
        except ValueError as exc:
            return _error(400, str(exc))
        return Response(sampler.history_json(seconds), media_type="application/json",
                        headers=_NO_STORE)

    async def stream(request: Request) -> Response:
        try:
            feed = sampler.feed()
        except SubscriberLimit as exc:
            return _error(503, str(exc))
        return StreamingResponse(_events(feed), media_type="text/event-stream",
                                 headers={**_NO_STORE, "X-Accel-Buffering": "no"})

    return [
        Route("/dashboard", show_page, methods=["GET"]),
        Route("/dashboard/", show_page, methods=["GET"]),
        Route("/dashboard/dashboard.js", show_script, methods=["GET"]),
        Route("/dashboard/api/stats", stats, methods=["GET"]),
        Route("/dashboard/api/history", history, methods=["GET"]),
        Route("/dashboard/api/stream", stream, methods=["GET"]),
    ]


async def _events(feed: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    """Server-sent events: ``retry`` first, then one ``stats`` event per document."""
    async with contextlib.aclosing(feed):
        yield f"retry: {SSE_RETRY_MS}\n\n".encode()
        async for document in feed:
            yield b"event: stats\ndata: " + document + b"\n\n"
