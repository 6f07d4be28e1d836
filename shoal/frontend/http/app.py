"""The HTTP/REST endpoint (KServe v2 + Triton extensions) as a Starlette app over a DataPlane.

Routes follow Triton's regexes (http_server.cc): model names are one path segment, versions are
``[0-9]+``. Unknown paths answer 404 ``{"error":"Not Found"}``, a wrong method 405
``{"error":"Method Not Allowed"}``; every error body is ``{"error": "..."}`` with the status of its
Triton code (``errors.py``). Unexpected exceptions are logged and answered 500
``{"error":"internal error"}``.

Threads: everything runs on the event loop that serves the app, as the DataPlane requires.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp

from shoal.errors import ShoalError, invalid_arg
from shoal.frontend.core import documents, model_lookup
from shoal.frontend.core.header_forward import compile_pattern
from shoal.frontend.core.log_settings import LogSettings, ProcessLogSettings
from shoal.frontend.core.model_control import ModelControl, require_model_control
from shoal.frontend.http.endpoint import Endpoint
from shoal.frontend.http.errors import (
    JSON_CONTENT_TYPE,
    error_response,
    internal_error_response,
    json_response,
    shoal_error_response,
)
from shoal.frontend.http.generate import GenerateHandler
from shoal.frontend.http.infer import InferHandler, read_body
from shoal.frontend.http.jsonparse import parse_json_object
from shoal.frontend.http.openai_api.routes import OpenAiApi
from shoal.frontend.http.openapi import openapi_route
from shoal.frontend.http.restricted import ApiRoute, gate_routes
from shoal.frontend.http.shared_memory import SharedMemoryApi
from shoal.frontend.http.trace_api import TraceApi
from shoal.frontend.restricted import ApiCategory, RestrictedApis
from shoal.settings import FrontendSettings
from shoal.trace.config import TraceConfig
from shoal.trace.sampling import Tracer

if TYPE_CHECKING:
    from shoal.frontend.core.dataplane import DataPlane

logger = logging.getLogger(__name__)


def guarded(endpoint: Endpoint) -> Endpoint:
    """ShoalError -> its Triton status and ``{"error"}``; anything else -> logged 500."""

    async def run(request: Request) -> Response:
        try:
            return await endpoint(request)
        except ShoalError as error:
            logger.debug("%s %s -> %s: %s", request.method, request.url.path,
                         error.code.name, error.message)
            return shoal_error_response(error)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody is listening any more
        except Exception as exc:
            return internal_error_response(exc, f"{request.method} {request.url.path}")

    return run


def _version(request: Request) -> str | None:
    version = request.path_params.get("version")
    return None if version is None else str(version)


class HttpApi:
    """The non-infer endpoints. One per app; ``log_settings`` are this process's (shared with
    its gRPC endpoint when given)."""

    def __init__(self, dataplane: DataPlane, settings: FrontendSettings,
                 log_settings: ProcessLogSettings | None = None) -> None:
        self.dataplane = dataplane
        self.settings = settings
        self.log_settings = log_settings or ProcessLogSettings(
            LogSettings.starting(settings))
        self.model_control = dataplane if isinstance(dataplane, ModelControl) else None

    async def _json_body(self, request: Request, what: str) -> dict[str, Any]:
        body = await read_body(request, self.settings.http.max_input_size)
        return parse_json_object(body, what) if body.strip() else {}

    # ---------------------------------------------------------------- health and metadata

    def _health(self, ok: bool) -> Response:
        if self.dataplane.is_exiting():
            return error_response(503, "Server exiting")
        return Response(status_code=200 if ok else 400)

    async def live(self, request: Request) -> Response:
        return self._health(self.dataplane.is_live())

    async def ready(self, request: Request) -> Response:
        return self._health(self.dataplane.is_ready())

    async def server_metadata(self, request: Request) -> Response:
        return json_response(documents.server_metadata(self.model_control is not None,
                                                       self.settings.server_id))

    async def model_metadata(self, request: Request) -> Response:
        name, version = request.path_params["model"], _version(request)
        model = self.dataplane.model(name, version)
        versions = [model.version] if version is not None else (
            self.dataplane.ready_versions(name) or [model.version])
        return json_response(documents.model_metadata(model, versions))

    async def model_ready(self, request: Request) -> Response:
        if self.dataplane.model_ready(request.path_params["model"], _version(request)):
            return Response(status_code=200)
        return error_response(400, "Model version not ready")

    async def model_config(self, request: Request) -> Response:
        model = self.dataplane.model(request.path_params["model"], _version(request))
        return Response(model.config_json, 200, media_type=JSON_CONTENT_TYPE)

    # ---------------------------------------------------------------- statistics

    async def all_stats(self, request: Request) -> Response:
        return await self._stats("", -1)

    async def model_stats(self, request: Request) -> Response:
        name = request.path_params["model"]
        return await self._stats(name, model_lookup.stats_version(_version(request)))

    async def _stats(self, name: str, version: int) -> Response:
        reply = await self.dataplane.stats(name, version)
        if reply.error is not None:
            raise ShoalError(reply.error.code, reply.error.message)
        return json_response(documents.model_statistics(reply.models))

    # ---------------------------------------------------------------- model repository

    async def repository_index(self, request: Request) -> Response:
        document = await self._json_body(request, "repository index request")
        ready = document.get("ready", False)
        if not isinstance(ready, bool):
            raise invalid_arg("Unable to parse 'ready': expected a boolean")
        return json_response(documents.repository_index(self.dataplane.snapshot, ready))

    def _control(self, request: Request) -> ModelControl:
        return require_model_control(self.settings, self.model_control,
                                     "repository" in request.path_params)

    async def load_model(self, request: Request) -> Response:
        control = self._control(request)
        document = await self._json_body(request, "model load request")
        await control.load_model(request.path_params["model"], _load_parameters(document))
        return Response(status_code=200)

    async def unload_model(self, request: Request) -> Response:
        control = self._control(request)
        document = await self._json_body(request, "model unload request")
        parameters = document.get("parameters", {})
        if not isinstance(parameters, dict):
            raise invalid_arg("Unable to parse 'parameters': expected a JSON object")
        dependents = parameters.get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise invalid_arg("Unable to parse 'unload_dependents': expected a boolean")
        await control.unload_model(request.path_params["model"], dependents)
        return Response(status_code=200)

    # ---------------------------------------------------------------- logging

    async def logging_settings(self, request: Request) -> Response:
        if request.method == "POST":
            changes = await self._json_body(request, "logging request")
            self.log_settings.update(changes)
        return json_response(self.log_settings.current.as_json())


def _load_parameters(document: dict[str, Any]) -> dict[str, str | bytes]:
    parameters = document.get("parameters", {})
    if not isinstance(parameters, dict):
        raise invalid_arg("Unable to parse 'parameters': expected a JSON object")
    loaded: dict[str, str | bytes] = {}
    for key, value in parameters.items():
        if not isinstance(value, str):
            raise invalid_arg(f"Unable to parse parameter '{key}': expected a string")
        if key.startswith("file:"):
            try:
                loaded[key] = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise invalid_arg(f"Unable to parse parameter '{key}': invalid base64") from None
        else:
            loaded[key] = value
    return loaded


INFER_ROUTE: Final = "/v2/models/{model}/infer"


def _model_routes(prefix: str, api: HttpApi, infer: Endpoint) -> list[ApiRoute]:
    generate = GenerateHandler(api.dataplane, api.settings.http.max_input_size, streaming=False)
    generate_stream = GenerateHandler(api.dataplane, api.settings.http.max_input_size,
                                      streaming=True)
    return [
        ApiRoute(prefix, guarded(api.model_metadata), methods=["GET"],
                 category=ApiCategory.METADATA),
        ApiRoute(prefix + "/ready", guarded(api.model_ready), methods=["GET"],
                 category=ApiCategory.HEALTH),
        ApiRoute(prefix + "/config", guarded(api.model_config), methods=["GET"],
                 category=ApiCategory.MODEL_CONFIG),
        ApiRoute(prefix + "/stats", guarded(api.model_stats), methods=["GET"],
                 category=ApiCategory.STATISTICS),
        ApiRoute(prefix + "/infer", infer, methods=["POST"], category=ApiCategory.INFERENCE),
        ApiRoute(prefix + "/generate", guarded(generate), methods=["POST"],
                 category=ApiCategory.INFERENCE),
        ApiRoute(prefix + "/generate_stream", guarded(generate_stream), methods=["POST"],
                 category=ApiCategory.INFERENCE),
    ]


def _routes(api: HttpApi, infer: Endpoint) -> list[BaseRoute]:
    """The route table: every route is an ApiRoute with its category (``http/restricted.py``)."""
    routes: list[BaseRoute] = [
        *SharedMemoryApi(api.dataplane, api.settings).routes(guarded),
        ApiRoute("/v2", guarded(api.server_metadata), methods=["GET"],
                 category=ApiCategory.METADATA),
        ApiRoute("/v2/health/live", guarded(api.live), methods=["GET"],
                 category=ApiCategory.HEALTH),
        ApiRoute("/v2/health/ready", guarded(api.ready), methods=["GET"],
                 category=ApiCategory.HEALTH),
        ApiRoute("/v2/models/stats", guarded(api.all_stats), methods=["GET"],
                 category=ApiCategory.STATISTICS),
        ApiRoute("/v2/logging", guarded(api.logging_settings), methods=["GET", "POST"],
                 category=ApiCategory.LOGGING),
    ]
    for prefix in ("/v2/repository", "/v2/repository/{repository}"):
        routes.append(ApiRoute(prefix + "/index", guarded(api.repository_index),
                               methods=["POST"], category=ApiCategory.MODEL_REPOSITORY))
        routes.append(ApiRoute(prefix + "/models/{model}/load", guarded(api.load_model),
                               methods=["POST"], category=ApiCategory.MODEL_REPOSITORY))
        routes.append(ApiRoute(prefix + "/models/{model}/unload", guarded(api.unload_model),
                               methods=["POST"], category=ApiCategory.MODEL_REPOSITORY))
    routes += _model_routes("/v2/models/{model}", api, infer)
    routes += _model_routes("/v2/models/{model}/versions/{version:int}", api, infer)
    routes += OpenAiApi(api.dataplane, api.settings.http.max_input_size).routes()  # /v1/...
    return routes


async def _http_exception(request: Request, exc: Exception) -> Response:
    if isinstance(exc, HTTPException):
        return error_response(exc.status_code, exc.detail, exc.headers)
    return internal_error_response(exc, f"{request.method} {request.url.path}")


async def _unexpected(request: Request, exc: Exception) -> Response:
    return internal_error_response(exc, f"{request.method} {request.url.path}")


def create_app(
    dataplane: DataPlane,
    settings: FrontendSettings,
    *,
    extra_routes: Sequence[BaseRoute] = (),
    log_settings: ProcessLogSettings | None = None,
    tracer: Tracer | None = None,  # trace settings, sampling (default: this app's own)
) -> Starlette:
    """The HTTP app. ``extra_routes`` (ApiRoutes) are matched before the built-in routes;
    ``log_settings`` are shared with the process's other endpoints. Every route gets the gate of
    its category from ``--http-restricted-api`` (TypeError for a route without a category)."""
    api = HttpApi(dataplane, settings, log_settings)
    infer_handler = InferHandler(dataplane, settings.http.max_input_size,
                                 compile_pattern(settings.http.header_forward_pattern))
    infer = guarded(infer_handler)
    tracer = tracer or Tracer(TraceConfig.from_triples(settings.trace_config))
    routes = [*extra_routes, *_routes(api, infer),
              *TraceApi(dataplane, tracer, settings.http.max_input_size).routes(guarded)]
    routes.append(openapi_route(routes))  # GET /v2/openapi.json: the document of this table
    gate_routes(routes, RestrictedApis(settings.http.restricted_apis))
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: _http_exception, Exception: _unexpected},
    )
    app.router.redirect_slashes = False  # Triton: "/v2/" is not "/v2"
    app.state.api = api
    app.state.infer = infer
    app.state.infer_handler = infer_handler
    app.state.tracer = tracer
    app.state.infer_route = next(r for r in routes
                                 if isinstance(r, ApiRoute) and r.path == INFER_ROUTE)
    return app


def create_asgi_app(dataplane: DataPlane, settings: FrontendSettings,
                    log_settings: ProcessLogSettings | None = None,
                    tracer: Tracer | None = None) -> ASGIApp:
    """What the frontend serves: the app behind the infer fast path (same endpoints), which
    samples requests for tracing. Served by uvicorn with ``GuardedHttpProtocol``, its
    ``lean_infer`` lets the protocol answer infer requests itself (``http/lean.py``)."""
    from shoal.frontend.http.fastpath import InferFastPath
    from shoal.frontend.http.lean import LeanInfer

    app = create_app(dataplane, settings, log_settings=log_settings, tracer=tracer)
    fast = InferFastPath(app, app.state.infer, settings.http.max_input_size,
                         app.state.infer_route.gate, app.state.tracer)
    fast.lean_infer = LeanInfer(app.state.infer_handler, dataplane,
                                settings.http.max_input_size, app.state.infer_route.gate,
                                app.state.tracer)
    return fast
