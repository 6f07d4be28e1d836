"""The shape of an HTTP endpoint: a Starlette request in, a response out (the routes of
``app.py`` and the ASGI fast path of ``fastpath.py`` both take and wrap these)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

Endpoint = Callable[[Request], Awaitable[Response]]
