"""The HTTP port's own OpenAPI 3.1 document, served at ``GET /v2/openapi.json``.

The document is generated from the app's route table (``openapi_route(routes)``): every route's
path and methods become the document's operations, so a route cannot be served undocumented.
What each operation takes and answers comes from ``OPERATIONS`` (keyed by method and the route's
path as Starlette spells it); a route missing there is still listed, with the generic error
responses only, and ``tests/frontend/test_openapi_document.py`` fails until it gets its entry
(that test also fails for an entry no route serves).

Error bodies are ``{"error": "<message>"}`` with the status of their Triton code
(``errors.py``): 400 bad input (unknown version, bad JSON ...), 403 a restricted API without its
header, 404 an unknown model or path, 501 unsupported, 503 unavailable (exiting, queue full,
load / unload outside explicit mode). The OpenAI routes use OpenAI's error shape
(``openai_api/errors.py``). No operation documents 500: a 500 is a bug.

The route is category ``metadata`` (``--http-restricted-api=metadata:...`` hides it with the
server metadata it describes). The document is built on the first request and then reused.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from shoal.frontend.core.documents import TRITON_COMPAT_VERSION
from shoal.frontend.http.errors import JSON_CONTENT_TYPE
from shoal.frontend.http.restricted import ApiRoute
from shoal.frontend.restricted import ApiCategory

OPENAPI_PATH: Final = "/v2/openapi.json"
SSE: Final = "text/event-stream"
# one Server-Sent Event as a client's parser reads it (the payload is ``data``, JSON text)
_EVENT: Final[dict[str, Any]] = {"type": "object", "required": ["data"],
                                 "properties": {"data": {"type": "string"},
                                                "event": {"type": "string"}}}

_Schema = dict[str, Any]
_PARAM: Final = re.compile(r"\{([a-z_]+)(?::([a-z]+))?\}")

# ------------------------------------------------------------------ schemas

ERROR: Final[_Schema] = {"type": "object", "required": ["error"],
                         "properties": {"error": {"type": "string"}}}
OPENAI_ERROR: Final[_Schema] = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]},
                       "code": {"type": ["string", "null"]}}}}}
_OBJECT: Final[_Schema] = {"type": "object"}
_PARAMETERS: Final[_Schema] = {
    "type": "object",
    "additionalProperties": {"type": ["string", "integer", "number", "boolean"]}}
_TENSOR_META: Final[_Schema] = {
    "type": "object", "required": ["name", "datatype", "shape"],
    "properties": {"name": {"type": "string"}, "datatype": {"type": "string"},
                   "shape": {"type": "array", "items": {"type": "integer"}}}}
_INFER_REQUEST: Final[_Schema] = {
    "type": "object", "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": _PARAMETERS,
        "inputs": {"type": "array", "items": {
            "type": "object", "required": ["name", "shape", "datatype"],
            "properties": {"name": {"type": "string"}, "datatype": {"type": "string"},
                           "shape": {"type": "array", "items": {"type": "integer"}},
                           "parameters": _PARAMETERS, "data": {}}}},
        "outputs": {"type": "array", "items": {
            "type": "object", "required": ["name"],
            "properties": {"name": {"type": "string"}, "parameters": _PARAMETERS}}}}}
_INFER_RESPONSE: Final[_Schema] = {
    "type": "object", "required": ["model_name", "outputs"],
    "properties": {"model_name": {"type": "string"}, "model_version": {"type": "string"},
                   "id": {"type": "string"}, "parameters": _OBJECT,
                   "outputs": {"type": "array", "items": _TENSOR_META}}}
_SERVER_METADATA: Final[_Schema] = {
    "type": "object", "required": ["name", "version", "extensions"],
    "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                   "extensions": {"type": "array", "items": {"type": "string"}}}}
_MODEL_METADATA: Final[_Schema] = {
    "type": "object", "required": ["name", "versions", "platform", "inputs", "outputs"],
    "properties": {"name": {"type": "string"},
                   "versions": {"type": "array", "items": {"type": "string"}},
                   "platform": {"type": "string"},
                   "inputs": {"type": "array", "items": _TENSOR_META},
                   "outputs": {"type": "array", "items": _TENSOR_META}}}
_STATISTICS: Final[_Schema] = {
    "type": "object", "required": ["model_stats"],
    "properties": {"model_stats": {"type": "array", "items": _OBJECT}}}
_INDEX_REQUEST: Final[_Schema] = {"type": "object", "properties": {"ready": {"type": "boolean"}}}
_INDEX: Final[_Schema] = {"type": "array", "items": {
    "type": "object", "required": ["name"],
    "properties": {"name": {"type": "string"}, "version": {"type": "string"},
                   "state": {"type": "string"}, "reason": {"type": "string"}}}}
_LOAD_REQUEST: Final[_Schema] = {
    "type": "object",
    "properties": {"parameters": {"type": "object", "additionalProperties": {"type": "string"}}}}
_UNLOAD_REQUEST: Final[_Schema] = {
    "type": "object",
    "properties": {"parameters": {"type": "object",
                                  "properties": {"unload_dependents": {"type": "boolean"}}}}}
_LOG_SETTINGS: Final[_Schema] = {
    "type": "object",
    "properties": {"log_file": {"type": "string"}, "log_info": {"type": "boolean"},
                   "log_warning": {"type": "boolean"}, "log_error": {"type": "boolean"},
                   "log_verbose_level": {"type": "integer"},
                   "log_format": {"type": "string"}}}
_TRACE_SETTINGS: Final[_Schema] = {
    "type": "object",
    "properties": {"trace_level": {"type": ["array", "null"], "items": {"type": "string"}},
                   "trace_rate": {"type": ["string", "null"]},
                   "trace_count": {"type": ["string", "null"]},
                   "log_frequency": {"type": ["string", "null"]},
                   "trace_file": {"type": ["string", "null"]},
                   "trace_mode": {"type": ["string", "null"]}}}
_SYSTEM_REGISTER: Final[_Schema] = {
    "type": "object", "required": ["key", "byte_size"],
    "properties": {"key": {"type": "string"}, "offset": {"type": "integer", "minimum": 0},
                   "byte_size": {"type": "integer", "minimum": 0}}}
_CUDA_REGISTER: Final[_Schema] = {
    "type": "object", "required": ["raw_handle", "device_id", "byte_size"],
    "properties": {"raw_handle": {"type": "object", "required": ["b64"],
                                  "properties": {"b64": {"type": "string"}}},
                   "device_id": {"type": "integer", "minimum": 0},
                   "byte_size": {"type": "integer", "minimum": 0}}}
_SYSTEM_STATUS: Final[_Schema] = {"type": "array", "items": {
    "type": "object", "required": ["name", "key", "offset", "byte_size"],
    "properties": {"name": {"type": "string"}, "key": {"type": "string"},
                   "offset": {"type": "integer"}, "byte_size": {"type": "integer"}}}}
_CUDA_STATUS: Final[_Schema] = {"type": "array", "items": {
    "type": "object", "required": ["name", "device_id", "byte_size"],
    "properties": {"name": {"type": "string"}, "device_id": {"type": "integer"},
                   "byte_size": {"type": "integer"}}}}
_GENERATE_REQUEST: Final[_Schema] = {
    "type": "object", "properties": {"id": {"type": "string"}, "parameters": _OBJECT}}
_OPENAI_MODEL: Final[_Schema] = {
    "type": "object", "required": ["id", "object", "owned_by"],
    "properties": {"id": {"type": "string"}, "object": {"const": "model"},
                   "created": {"type": "integer"}, "owned_by": {"type": "string"}}}
_OPENAI_MODELS: Final[_Schema] = {
    "type": "object", "required": ["object", "data"],
    "properties": {"object": {"const": "list"},
                   "data": {"type": "array", "items": _OPENAI_MODEL}}}
_STOP: Final[_Schema] = {"type": ["string", "array", "null"], "items": {"type": "string"}}
_SAMPLING: Final[dict[str, _Schema]] = {
    "model": {"type": "string"}, "max_tokens": {"type": ["integer", "null"]},
    "temperature": {"type": ["number", "null"]}, "top_p": {"type": ["number", "null"]},
    "n": {"type": ["integer", "null"]}, "seed": {"type": ["integer", "null"]},
    "stop": _STOP, "stream": {"type": ["boolean", "null"]}, "user": {"type": "string"}}
_COMPLETION_REQUEST: Final[_Schema] = {
    "type": "object", "required": ["model", "prompt"],
    "properties": {**_SAMPLING, "prompt": {"type": ["string", "array"]}}}
_CHAT_REQUEST: Final[_Schema] = {
    "type": "object", "required": ["model", "messages"],
    "properties": {**_SAMPLING, "max_completion_tokens": {"type": ["integer", "null"]},
                   "messages": {"type": "array", "items": {
                       "type": "object", "required": ["role"],
                       "properties": {"role": {"type": "string"}, "content": {}}}}}}
_COMPLETION: Final[_Schema] = {
    "type": "object", "required": ["id", "object", "choices"],
    "properties": {"id": {"type": "string"}, "object": {"type": "string"},
                   "model": {"type": "string"}, "choices": {"type": "array"},
                   "usage": _OBJECT}}

# ------------------------------------------------------------------ responses


def _json(description: str, schema: _Schema) -> dict[str, Any]:
    return {"description": description, "content": {JSON_CONTENT_TYPE: {"schema": schema}}}


def _errors(*statuses: int, openai: bool = False) -> dict[str, Any]:
    """The error responses: 403 (restricted) always, plus ``statuses``."""
    texts = {400: "bad request", 403: "restricted API: the request lacks its header",
             404: "not found", 501: "not supported by this server",
             503: "unavailable (server exiting, queue full, explicit mode required)"}
    shape = OPENAI_ERROR if openai else ERROR
    return {str(s): _json(texts[s], shape) for s in sorted({403, *statuses})}


_EMPTY_OK: Final = {"200": {"description": "done (empty body)"}}
_MODEL_ERRORS: Final = (400, 404, 503)


def _op(summary: str, responses: dict[str, Any], body: _Schema | None = None,
        media: Sequence[str] = (JSON_CONTENT_TYPE,)) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": summary, "responses": responses}
    if body is not None:
        content: dict[str, Any] = {m: {"schema": body} for m in media}
        if "application/octet-stream" in content:
            content["application/octet-stream"] = {"schema": {"type": "string",
                                                              "format": "binary"}}
        operation["requestBody"] = {"required": False, "content": content}
    return operation


def _model_operations(prefix: str) -> dict[tuple[str, str], dict[str, Any]]:
    infer_ok = {"description": "the outputs (binary outputs: octet-stream after the JSON head)",
                "content": {JSON_CONTENT_TYPE: {"schema": _INFER_RESPONSE},
                            "application/octet-stream": {"schema": {"type": "string",
                                                                    "format": "binary"}}}}
    stream = {"description": "Server-Sent Events, one `data: {json}` per response",
              "content": {SSE: {"schema": _EVENT}}}
    stream_errors = _errors(*_MODEL_ERRORS)
    stream_errors["400"]["content"][SSE] = {"schema": _EVENT}
    return {
        ("GET", prefix): _op("model metadata", {
            "200": _json("the model's metadata", _MODEL_METADATA), **_errors(*_MODEL_ERRORS)}),
        ("GET", prefix + "/ready"): _op("model readiness", {
            **_EMPTY_OK, **_errors(*_MODEL_ERRORS)}),
        ("GET", prefix + "/config"): _op("model configuration", {
            "200": _json("the model configuration (Triton's JSON form)", _OBJECT),
            **_errors(*_MODEL_ERRORS)}),
        ("GET", prefix + "/stats"): _op("model statistics", {
            "200": _json("statistics", _STATISTICS), **_errors(*_MODEL_ERRORS)}),
        ("POST", prefix + "/infer"): _op("inference (KServe v2)", {
            "200": infer_ok, **_errors(*_MODEL_ERRORS, 501)}, _INFER_REQUEST,
            (JSON_CONTENT_TYPE, "application/octet-stream")),
        ("POST", prefix + "/generate"): _op("generate extension, one response", {
            "200": _json("the response's outputs by name", _OBJECT),
            **_errors(*_MODEL_ERRORS, 501)}, _GENERATE_REQUEST),
        ("POST", prefix + "/generate_stream"): _op("generate extension, streamed", {
            "200": stream, **stream_errors}, _GENERATE_REQUEST),
    }


def _shm_operations(kind: str, register: _Schema, status: _Schema
                    ) -> dict[tuple[str, str], dict[str, Any]]:
    operations: dict[tuple[str, str], dict[str, Any]] = {}
    for prefix in (f"/v2/{kind}sharedmemory", f"/v2/{kind}sharedmemory/region/{{region}}"):
        operations[("GET", prefix + "/status")] = _op(f"{kind} shared-memory regions", {
            "200": _json("the registered regions", status), **_errors(400, 404)})
        operations[("POST", prefix + "/register")] = _op(f"register a {kind} region", {
            **_EMPTY_OK, **_errors(400, 501, 503)}, register)
        operations[("POST", prefix + "/unregister")] = _op(f"unregister {kind} region(s)", {
            **_EMPTY_OK, **_errors(400)})
    return operations


def _repository_operations() -> dict[tuple[str, str], dict[str, Any]]:
    operations: dict[tuple[str, str], dict[str, Any]] = {}
    for prefix in ("/v2/repository", "/v2/repository/{repository}"):
        operations[("POST", prefix + "/index")] = _op("repository index", {
            "200": _json("the models and their states", _INDEX), **_errors(400)},
            _INDEX_REQUEST)
        operations[("POST", prefix + "/models/{model}/load")] = _op("load a model", {
            **_EMPTY_OK, **_errors(400, 404, 501, 503)}, _LOAD_REQUEST)
        operations[("POST", prefix + "/models/{model}/unload")] = _op("unload a model", {
            **_EMPTY_OK, **_errors(400, 404, 501, 503)}, _UNLOAD_REQUEST)
    return operations


def _openai_operations() -> dict[tuple[str, str], dict[str, Any]]:
    answer = {"description": "the completion (with `stream`: Server-Sent Events)",
              "content": {JSON_CONTENT_TYPE: {"schema": _COMPLETION},
                          SSE: {"schema": _EVENT}}}
    return {
        ("GET", "/v1/models"): _op("OpenAI: the llm models", {
            "200": _json("the list", _OPENAI_MODELS), **_errors(openai=True)}),
        ("GET", "/v1/models/{model}"): _op("OpenAI: one llm model", {
            "200": _json("the model", _OPENAI_MODEL), **_errors(404, openai=True)}),
        ("POST", "/v1/completions"): _op("OpenAI: completions", {
            "200": answer, **_errors(400, 404, 503, openai=True)}, _COMPLETION_REQUEST),
        ("POST", "/v1/chat/completions"): _op("OpenAI: chat completions", {
            "200": answer, **_errors(400, 404, 503, openai=True)}, _CHAT_REQUEST),
    }


def _health(what: str) -> dict[str, Any]:
    return _op(what, {"200": {"description": "yes (empty body)"},
                      "400": {"description": "no (empty body)"},
                      **_errors(503)})


OPERATIONS: Final[dict[tuple[str, str], dict[str, Any]]] = {
    ("GET", "/v2"): _op("server metadata", {
        "200": _json("name, version, extensions", _SERVER_METADATA), **_errors()}),
    ("GET", "/v2/health/live"): _health("server liveness"),
    ("GET", "/v2/health/ready"): _health("server readiness"),
    ("GET", "/v2/models/stats"): _op("statistics of every model", {
        "200": _json("statistics", _STATISTICS), **_errors(400)}),
    ("GET", "/v2/logging"): _op("log settings", {
        "200": _json("the settings in force", _LOG_SETTINGS), **_errors()}),
    ("POST", "/v2/logging"): _op("change log settings", {
        "200": _json("the settings in force", _LOG_SETTINGS), **_errors(400, 501)},
        _LOG_SETTINGS),
    **{(method, path): _op(f"trace settings{' (change)' if method == 'POST' else ''}", {
        "200": _json("the settings in force", _TRACE_SETTINGS), **_errors(400)},
        _TRACE_SETTINGS if method == "POST" else None)
       for method in ("GET", "POST")
       for path in ("/v2/trace/setting", "/v2/models/{model}/trace/setting")},
    **_shm_operations("system", _SYSTEM_REGISTER, _SYSTEM_STATUS),
    **_shm_operations("cuda", _CUDA_REGISTER, _CUDA_STATUS),
    **_repository_operations(),
    **_model_operations("/v2/models/{model}"),
    **_model_operations("/v2/models/{model}/versions/{version:int}"),
    **_openai_operations(),
    ("GET", OPENAPI_PATH): _op("this document", {
        "200": _json("OpenAPI 3.1", _OBJECT), **_errors()}),
}

# ------------------------------------------------------------------ the document


def route_operations(routes: Sequence[BaseRoute]) -> list[tuple[str, str]]:
    """(method, Starlette path) of every operation the routes serve (HEAD, which Starlette
    adds to GET routes, is left out)."""
    found: list[tuple[str, str]] = []
    for route in routes:
        if isinstance(route, Route):
            found += [(m, route.path) for m in sorted(route.methods or ()) if m != "HEAD"]
    return found


def _parameters(path: str) -> tuple[str, list[dict[str, Any]]]:
    """The OpenAPI path and its path parameters (a ``:int`` segment is Triton's ``[0-9]+``)."""
    parameters = []
    for name, convertor in _PARAM.findall(path):
        schema: _Schema = ({"type": "string", "pattern": "^[0-9]+$"} if convertor == "int"
                           else {"type": "string", "minLength": 1, "pattern": "^[^/]+$"})
        parameters.append({"name": name, "in": "path", "required": True, "schema": schema})
    return _PARAM.sub(r"{\1}", path), parameters


def build_document(routes: Sequence[BaseRoute]) -> dict[str, Any]:
    """The OpenAPI document of ``routes`` (see the module doc)."""
    paths: dict[str, dict[str, Any]] = {}
    for method, path in route_operations(routes):
        openapi_path, parameters = _parameters(path)
        operation = dict(OPERATIONS.get((method, path), {
            "summary": "undocumented route", "responses": _errors(400, 404)}))
        operation["operationId"] = f"{method.lower()} {openapi_path}"
        if parameters:
            operation["parameters"] = parameters
        paths.setdefault(openapi_path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "shoal", "version": TRITON_COMPAT_VERSION,
                 "description": "KServe v2 inference protocol with Triton's extensions, and "
                                "the OpenAI-compatible routes, as this server serves them."},
        "paths": paths,
    }


def openapi_route(routes: Sequence[BaseRoute]) -> ApiRoute:
    """``GET /v2/openapi.json``: the document of ``routes`` (read at the first request, so the
    list may still grow, this route included, until the app serves)."""
    cached: list[bytes] = []

    async def document(request: Request) -> Response:
        if not cached:
            cached.append(orjson.dumps(build_document(routes)))
        return Response(cached[0], 200, media_type=JSON_CONTENT_TYPE)

    return ApiRoute(OPENAPI_PATH, document, methods=["GET"], category=ApiCategory.METADATA)
