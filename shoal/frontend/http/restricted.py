"""The restricted-API gate over HTTP (categories, flags and matching: ``frontend/restricted.py``).

Every route of the HTTP app is an ``ApiRoute``, which names its ``ApiCategory`` where it is
built; ``gate_routes`` (called by ``create_app`` on the whole route list) refuses any other kind
of route and gives each one the gate of its category. The check runs in ``ApiRoute.handle``,
i.e. after routing: whatever spelling reached the route (percent-encoded segments, a version
form, HEAD) is checked, a path that routes nowhere stays a plain 404, and a wrong method on a
restricted route is 403 before 405, as in Triton (the check opens each handler there). The
infer fast path, which skips the router, takes the infer route's gate (``fastpath.py``).

A refused request gets 403 ``{"error":"This API is restricted, expecting header '<key>'"}``
before its body is read. The metrics port has no route table of ours: ``DashboardGate`` checks
every path whose first segment is ``dashboard``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from shoal.frontend.http.errors import error_response
from shoal.frontend.restricted import (
    ApiCategory,
    RestrictedApis,
    Restriction,
    http_refusal_message,
    value_matches,
)


class HttpGate:
    """One restricted category's check: the first header named ``key`` must be ``value``."""

    def __init__(self, restriction: Restriction) -> None:
        self.restriction = restriction
        self._name = restriction.key.lower().encode("latin-1")  # ASGI header names are lowercase
        self._value = restriction.value.encode("latin-1")
        self._message = http_refusal_message(restriction.key)

    def refusal(self, scope: Scope) -> Response | None:
        """None when the request may pass, else the 403 to send."""
        for name, value in scope["headers"]:
            if name == self._name:
                return None if value_matches(self._value, value) else self._refuse()
        return self._refuse()

    def _refuse(self) -> Response:
        return error_response(403, self._message)


class ApiRoute(Route):
    """A Starlette route that belongs to one API category (required). Its ``gate`` is set by
    ``gate_routes``: None while its category is not restricted."""

    def __init__(self, path: str, endpoint: Callable[..., Any], *, methods: list[str],
                 category: ApiCategory) -> None:
        super().__init__(path, endpoint, methods=methods)
        self.category = category
        self.gate: HttpGate | None = None

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        gate = self.gate
        if gate is not None:
            refused = gate.refusal(scope)
            if refused is not None:
                await refused(scope, receive, send)
                return
        await super().handle(scope, receive, send)


def gate_routes(routes: Sequence[BaseRoute], restrictions: RestrictedApis) -> None:
    """Give every route its category's gate. Raises TypeError for a route without a category,
    so that no endpoint can be added past the restrictions."""
    for route in routes:
        if not isinstance(route, ApiRoute):
            path = getattr(route, "path", repr(route))
            raise TypeError(
                f"HTTP route {path} has no API category: build it with "
                "shoal.frontend.http.restricted.ApiRoute(path, endpoint, methods=[...], "
                "category=ApiCategory.<its category>) (see shoal/frontend/restricted.py)")
        restriction = restrictions.get(route.category)
        route.gate = None if restriction is None else HttpGate(restriction)


def _under_dashboard(path: str) -> bool:
    for segment in path.split("/"):
        if segment:
            return segment == ApiCategory.DASHBOARD.value
    return False


class DashboardGate:
    """The metrics port's gate: every path whose first non-empty segment is ``dashboard``
    needs the ``dashboard`` restriction's header; ``/metrics`` and the rest pass untouched."""

    def __init__(self, app: ASGIApp, gate: HttpGate) -> None:
        self._app = app
        self._gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _under_dashboard(scope["path"]):
            refused = self._gate.refusal(scope)
            if refused is not None:
                await refused(scope, receive, send)
                return
        await self._app(scope, receive, send)


def restrict_metrics_app(app: ASGIApp, restrictions: RestrictedApis) -> ASGIApp:
    """``app`` behind the dashboard gate, or ``app`` itself when the dashboard is open."""
    restriction = restrictions.get(ApiCategory.DASHBOARD)
    return app if restriction is None else DashboardGate(app, HttpGate(restriction))
