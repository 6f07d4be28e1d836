"""OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}`` with its status.

``OpenAiError`` is raised by request parsing and the handlers; ``openai_error_response`` turns it,
or a ``ShoalError`` from the data path (its Triton status: INVALID_ARG 400, NOT_FOUND 404,
UNAVAILABLE 503, ...), into the response. Types: ``invalid_request_error`` for 4xx,
``server_error`` for 5xx (``service_unavailable`` with 503).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from shoal.errors import ShoalError
from shoal.frontend.http.errors import JSON_CONTENT_TYPE, status_for


class OpenAiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def document(self) -> dict[str, Any]:
        return error_document(self.status, self.message, self.param, self.code)


def invalid(message: str, param: str | None, code: str | None = None) -> OpenAiError:
    """400 invalid_request_error naming ``param``."""
    return OpenAiError(400, message, param=param, code=code)


def model_not_found(model: str) -> OpenAiError:
    return OpenAiError(404, f"The model '{model}' does not exist or is not an llm-backend "
                       f"model of this server", param="model", code="model_not_found")


def error_document(status: int, message: str, param: str | None = None,
                   code: str | None = None) -> dict[str, Any]:
    kind = ("invalid_request_error" if status < 500 else
            "service_unavailable" if status == 503 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def from_shoal_error(error: ShoalError) -> OpenAiError:
    """A data-path error (e.g. the backend refusing ``max_tokens``) in OpenAI's shape."""
    return OpenAiError(status_for(error.code), error.message)


def openai_error_response(error: OpenAiError) -> Response:
    return Response(orjson.dumps(error.document()), error.status, media_type=JSON_CONTENT_TYPE)
