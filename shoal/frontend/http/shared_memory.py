"""Triton's shared-memory extensions over HTTP (``system_shared_memory``, ``cuda_shared_memory``).

Routes (Triton's regex ``/v2/(system|cuda)sharedmemory(?:/region/([^/]+))?/(status|register|
unregister)``): ``GET .../status`` answers a JSON array; ``POST .../region/R/register`` with
``{"key", "offset"?, "byte_size"}`` (system) or ``{"raw_handle": {"b64"}, "device_id",
"byte_size"}`` (CUDA) and ``POST ...[/region/R]/unregister`` answer 200 with an empty body.
Register/unregister need ``--allow-client-shm`` (UNSUPPORTED otherwise, as Triton since 2.69);
status always works. System and CUDA regions share one namespace; status and unregister of one
kind see only regions of that kind.

CUDA registration goes through ``shoal.frontend.cuda_shm.register_cuda_region``, shared with the
gRPC service (UNSUPPORTED when torch sees no CUDA device).

Threads: the event loop (the registry is single-threaded).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import orjson
from starlette.requests import Request
from starlette.responses import Response

from shoal.errors import invalid_arg, unsupported
from shoal.frontend.cuda_shm import register_cuda_region
from shoal.frontend.http.errors import JSON_CONTENT_TYPE
from shoal.frontend.http.infer import read_body
from shoal.frontend.http.jsonparse import parse_json_object
from shoal.frontend.http.restricted import ApiRoute
from shoal.frontend.restricted import ApiCategory
from shoal.frontend.shm_contract import DISABLED_MESSAGE

if TYPE_CHECKING:
    from shoal.frontend.core.dataplane import DataPlane
    from shoal.frontend.shm_contract import SharedMemoryRegistry
    from shoal.settings import FrontendSettings

Endpoint = Callable[[Request], Awaitable[Response]]
UINT64_MAX: Final = (1 << 64) - 1


def _json(document: Any) -> Response:
    return Response(orjson.dumps(document), 200, media_type=JSON_CONTENT_TYPE)


def _ok() -> Response:
    return Response(b"", 200, media_type=JSON_CONTENT_TYPE)


def _region(request: Request) -> str | None:
    region = request.path_params.get("region")
    return None if region is None else str(region)


class SharedMemoryApi:
    def __init__(self, dataplane: DataPlane, settings: FrontendSettings) -> None:
        self._dataplane = dataplane
        self._settings = settings

    @property
    def _registry(self) -> SharedMemoryRegistry:
        return self._dataplane.shared_memory

    # ---------------------------------------------------------------- system

    async def system_status(self, request: Request) -> Response:
        regions = self._registry.status(_region(request))
        return _json([{"name": r.name, "key": r.key, "offset": r.offset,
                       "byte_size": r.byte_size} for r in regions])

    async def system_register(self, request: Request) -> Response:
        self._check_enabled()
        name = _region(request) or ""
        document = await self._body(request)
        key = document.get("key")
        if "key" not in document:
            raise invalid_arg("Shared memory register request has no 'key' field")
        if not isinstance(key, str):
            raise invalid_arg("Unable to parse 'key': expected a string")
        offset = _uint_field(document, "offset", required=False)
        byte_size = _uint_field(document, "byte_size", required=True)
        self._registry.register(name, key, offset, byte_size)
        return _ok()

    async def system_unregister(self, request: Request) -> Response:
        self._registry.unregister(_region(request))
        return _ok()

    # ---------------------------------------------------------------- CUDA

    async def cuda_status(self, request: Request) -> Response:
        regions = self._registry.cuda_status(_region(request))
        return _json([{"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size}
                      for r in regions])

    async def cuda_register(self, request: Request) -> Response:
        self._check_enabled()
        name = _region(request) or ""
        document = await self._body(request)
        raw_handle = _raw_handle(document)
        device_id = _uint_field(document, "device_id", required=True)
        byte_size = _uint_field(document, "byte_size", required=True)
        await register_cuda_region(self._registry, self._settings, name, raw_handle, device_id,
                                   byte_size)
        return _ok()

    async def cuda_unregister(self, request: Request) -> Response:
        self._registry.cuda_unregister(_region(request))
        return _ok()

    # ---------------------------------------------------------------- helpers

    def _check_enabled(self) -> None:
        if not self._settings.client_shm.allowed:
            raise unsupported(DISABLED_MESSAGE)

    async def _body(self, request: Request) -> dict[str, Any]:
        body = await read_body(request, self._settings.http.max_input_size)
        return parse_json_object(body, "shared memory register request")

    def routes(self, guard: Callable[[Endpoint], Endpoint]) -> list[ApiRoute]:
        routes: list[ApiRoute] = []
        shm = ApiCategory.SHARED_MEMORY
        for kind, status, register, unregister in (
            ("system", self.system_status, self.system_register, self.system_unregister),
            ("cuda", self.cuda_status, self.cuda_register, self.cuda_unregister),
        ):
            for prefix in (f"/v2/{kind}sharedmemory", f"/v2/{kind}sharedmemory/region/{{region}}"):
                routes.append(ApiRoute(prefix + "/status", guard(status), methods=["GET"],
                                       category=shm))
                routes.append(ApiRoute(prefix + "/register", guard(register), methods=["POST"],
                                       category=shm))
                routes.append(ApiRoute(prefix + "/unregister", guard(unregister),
                                       methods=["POST"], category=shm))
        return routes


def _uint_field(document: dict[str, Any], key: str, *, required: bool) -> int:
    if key not in document:
        if required:
            raise invalid_arg(f"Shared memory register request has no '{key}' field")
        return 0
    value = document[key]
    if type(value) is not int or not 0 <= value <= UINT64_MAX:
        raise invalid_arg(f"Unable to parse '{key}': expected an unsigned integer")
    return value


def _raw_handle(document: dict[str, Any]) -> bytes:
    """``{"raw_handle": {"b64": "<base64>"}}`` decoded (its length is the registry's check)."""
    if "raw_handle" not in document:
        raise invalid_arg("Shared memory register request has no 'raw_handle' field")
    value = document["raw_handle"]
    encoded = value.get("b64") if isinstance(value, dict) else None
    if not isinstance(encoded, str):
        raise invalid_arg("Unable to parse 'raw_handle': expected {\"b64\": \"<base64>\"}")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise invalid_arg("Unable to parse 'raw_handle': 'b64' is not valid base64") from None
