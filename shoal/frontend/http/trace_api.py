"""Triton's trace extension over HTTP: ``GET``/``POST /v2/trace/setting`` and
``/v2/models/<model>/trace/setting``.

GET answers the settings in force (a model's: its own fields, the global ones for the rest);
POST applies ``{"trace_level": [...], "trace_rate": "N", "trace_count": "N", "log_frequency":
"N"}`` (null clears a field) and answers the result, or 400 ``{"error"}`` naming the field at
fault with nothing changed. ``trace_file`` is refused (400): the file is set at start-up only. A
model route needs a ready model (INVALID_ARG "Request for unknown model : <name>", Triton's
text). The settings and their semantics are ``shoal.trace`` (``values``, ``sampling``); they are
this frontend process's (see README: with ``--http-workers`` > 1 each process has its own).

Threads: the event loop (the tracer is single-threaded).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import orjson
from starlette.requests import Request
from starlette.responses import Response

from shoal.frontend.core.model_lookup import check_trace_model
from shoal.frontend.http.errors import JSON_CONTENT_TYPE
from shoal.frontend.http.infer import read_body
from shoal.frontend.http.jsonparse import parse_json_object
from shoal.frontend.http.restricted import ApiRoute
from shoal.frontend.restricted import ApiCategory
from shoal.trace.values import parse_http_change

if TYPE_CHECKING:
    from shoal.frontend.core.dataplane import DataPlane
    from shoal.trace.sampling import Tracer

Endpoint = Callable[[Request], Awaitable[Response]]

GLOBAL_PATH = "/v2/trace/setting"
MODEL_PATH = "/v2/models/{model}/trace/setting"


class TraceApi:
    def __init__(self, dataplane: DataPlane, tracer: Tracer, max_body: int) -> None:
        self._dataplane = dataplane
        self._tracer = tracer
        self._max_body = max_body

    async def setting(self, request: Request) -> Response:
        model = str(request.path_params.get("model", ""))
        check_trace_model(self._dataplane, model)
        if request.method == "POST":
            body = await read_body(request, self._max_body)
            document = parse_json_object(body, "trace setting request") if body.strip() else {}
            settings = self._tracer.update(model, parse_http_change(document))
        else:
            settings = self._tracer.settings(model)
        return Response(orjson.dumps(settings), 200, media_type=JSON_CONTENT_TYPE)

    def routes(self, guard: Callable[[Endpoint], Endpoint]) -> list[ApiRoute]:
        endpoint = guard(self.setting)
        return [ApiRoute(path, endpoint, methods=["GET", "POST"], category=ApiCategory.TRACE)
                for path in (GLOBAL_PATH, MODEL_PATH)]
