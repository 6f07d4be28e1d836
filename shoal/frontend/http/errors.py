"""Triton error code -> HTTP status, and the one error body shape: ``{"error": "<message>"}``.

This module is the only place in the HTTP layer that knows the mapping (Triton's
``HttpCodeFromError``): INTERNAL 500, NOT_FOUND 404, UNAVAILABLE 503, UNSUPPORTED 501,
UNKNOWN / INVALID_ARG / ALREADY_EXISTS / CANCELLED 400. ``json_response`` sends any other JSON
document.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final

import orjson
from starlette.responses import Response

from shoal.errors import ErrorCode, ShoalError

logger = logging.getLogger(__name__)

HTTP_STATUS: Final[Mapping[ErrorCode, int]] = {
    ErrorCode.UNKNOWN: 400,
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.INVALID_ARG: 400,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.ALREADY_EXISTS: 400,
    ErrorCode.CANCELLED: 400,
}

JSON_CONTENT_TYPE: Final = "application/json"
INTERNAL_ERROR_MESSAGE: Final = "internal error"


class ShoalHTTPError(ShoalError):
    """A ShoalError that also asks for response headers (e.g. ``Accept-Encoding`` on an
    unsupported ``Content-Encoding``)."""

    def __init__(self, code: ErrorCode, message: str, headers: Mapping[str, str]) -> None:
        super().__init__(code, message)
        self.headers = dict(headers)


def status_for(code: ErrorCode) -> int:
    return HTTP_STATUS.get(code, 500)


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


def json_response(document: object, status: int = 200) -> Response:
    """Any JSON document (success or error shape) as a response."""
    return Response(orjson.dumps(document), status, media_type=JSON_CONTENT_TYPE)


def error_response(
    status: int, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(error_body(message), status, headers, media_type=JSON_CONTENT_TYPE)


def shoal_error_response(error: ShoalError) -> Response:
    headers = error.headers if isinstance(error, ShoalHTTPError) else None
    return error_response(status_for(error.code), error.message, headers)


def internal_error_response(exc: BaseException, where: str) -> Response:
    """An unexpected exception: logged with its stack here, a bare 500 for the client."""
    logger.error("unexpected error in %s", where, exc_info=exc)
    return error_response(500, INTERNAL_ERROR_MESSAGE)
