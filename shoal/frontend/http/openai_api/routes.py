"""The OpenAI-compatible routes on the HTTP port.

- ``GET /v1/models`` and ``GET /v1/models/{model}`` (category ``metadata``): the models served by
  the ``llm`` backend, in OpenAI's list / model shape.
- ``POST /v1/completions`` and ``POST /v1/chat/completions`` (category ``inference``):
  ``params.py`` reads the body, ``generation.py`` runs one backend request per choice. Without
  ``stream`` the answer is one JSON object with ``usage``; with it, Server-Sent Events
  ``data: {chunk}`` ending with ``data: [DONE]`` (a chat stream first sends each choice's
  ``role``; the last chunk of a choice carries its ``finish_reason``; with
  ``stream_options.include_usage`` every chunk has ``"usage": null`` and a last chunk with no
  choices carries the usage). An error before the first event keeps its status; one after it
  becomes a ``data: {"error": {...}}`` event, then ``[DONE]``. A client that leaves mid-stream
  cancels the backend requests.

Usage: ``prompt_tokens`` once per request, ``completion_tokens`` summed over the choices
(counting the end token that finished a choice, and for a stop string the tokens generated up to
it). Errors use OpenAI's shape (``errors.py``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from shoal.errors import ErrorCode, ShoalError
from shoal.frontend.core.prepare import closing
from shoal.frontend.http.errors import INTERNAL_ERROR_MESSAGE, json_response
from shoal.frontend.http.generate import SSE_CONTENT_TYPE
from shoal.frontend.http.infer import read_body
from shoal.frontend.http.openai_api.errors import (
    OpenAiError,
    error_document,
    from_shoal_error,
    model_not_found,
    openai_error_response,
)
from shoal.frontend.http.openai_api.generation import Generation, Piece, require_interface
from shoal.frontend.http.openai_api.logprobs import Entry, LogprobsShaper
from shoal.frontend.http.openai_api.params import GenerationParams, parse_params
from shoal.frontend.http.restricted import ApiRoute
from shoal.frontend.restricted import ApiCategory
from shoal.messages import ModelVersionInfo

if TYPE_CHECKING:
    from shoal.frontend.core.dataplane import DataPlane

logger = logging.getLogger(__name__)

LLM_BACKEND = "llm"
OWNER = "shoal"

Endpoint = Callable[[Request], Awaitable[Response]]


def openai_guarded(endpoint: Endpoint) -> Endpoint:
    """OpenAiError / ShoalError -> OpenAI's error shape; anything else -> logged 500."""

    async def run(request: Request) -> Response:
        try:
            return await endpoint(request)
        except OpenAiError as error:
            return openai_error_response(error)
        except ShoalError as error:
            return openai_error_response(from_shoal_error(error))
        except ClientDisconnect:
            return Response(status_code=400)
        except Exception as exc:
            logger.error("unexpected error in %s %s", request.method, request.url.path,
                         exc_info=exc)
            return json_response(error_document(500, INTERNAL_ERROR_MESSAGE), 500)

    return run


def is_llm_model(model: ModelVersionInfo) -> bool:
    try:
        config = orjson.loads(model.config_json)
    except orjson.JSONDecodeError:
        return False
    return isinstance(config, dict) and config.get("backend") == LLM_BACKEND


class OpenAiApi:
    def __init__(self, dataplane: DataPlane, max_input_bytes: int) -> None:
        self._dataplane = dataplane
        self._limit = max_input_bytes

    def routes(self) -> list[ApiRoute]:
        return [
            ApiRoute("/v1/models", openai_guarded(self.list_models), methods=["GET"],
                     category=ApiCategory.METADATA),
            ApiRoute("/v1/models/{model}", openai_guarded(self.get_model), methods=["GET"],
                     category=ApiCategory.METADATA),
            ApiRoute("/v1/completions", openai_guarded(self.completions), methods=["POST"],
                     category=ApiCategory.INFERENCE),
            ApiRoute("/v1/chat/completions", openai_guarded(self.chat_completions),
                     methods=["POST"], category=ApiCategory.INFERENCE),
        ]

    # ---------------------------------------------------------------- models

    def _served(self) -> list[str]:
        names = {m.name for m in self._dataplane.snapshot.models
                 if m.serving and is_llm_model(m)}
        return sorted(names)

    @staticmethod
    def _model_document(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": 0, "owned_by": OWNER}

    async def list_models(self, request: Request) -> Response:
        return json_response({"object": "list",
                      "data": [self._model_document(name) for name in self._served()]})

    async def get_model(self, request: Request) -> Response:
        name = request.path_params["model"]
        if name not in self._served():
            raise model_not_found(name)
        return json_response(self._model_document(name))

    def _model(self, name: str) -> ModelVersionInfo:
        if name not in {m.name for m in self._dataplane.snapshot.models if is_llm_model(m)}:
            raise model_not_found(name)
        try:
            return self._dataplane.model(name, None)
        except ShoalError as error:
            if error.code in (ErrorCode.NOT_FOUND, ErrorCode.INVALID_ARG):
                raise model_not_found(name) from None
            raise

    # ---------------------------------------------------------------- completions

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Request, chat: bool) -> Response:
        params = parse_params(await read_body(request, self._limit), chat=chat)
        model = self._model(params.model)
        require_interface(model, chat)
        shape = _Shape(params)
        pieces = Generation(self._dataplane, model, params).choices()
        if not params.stream:
            return json_response(await shape.whole(pieces))
        try:
            first = await anext(pieces)  # errors before the first event keep their status
        except StopAsyncIteration:
            first = None
        return StreamingResponse(shape.events(first, pieces), media_type=SSE_CONTENT_TYPE)


class _Shape:
    """The response documents of one request (completion or chat)."""

    def __init__(self, params: GenerationParams) -> None:
        self._params = params
        self._chat = params.chat
        self._id = ("chatcmpl-" if params.chat else "cmpl-") + uuid.uuid4().hex
        self._created = int(time.time())
        self._prompt_tokens = 0
        self._completion_tokens = [0] * params.n
        self._logprobs = LogprobsShaper(params.extras, chat=params.chat, n=params.n)

    def _count(self, piece: Piece) -> None:
        self._prompt_tokens = piece.prompt_tokens
        self._completion_tokens[piece.index] = piece.completion_tokens

    def _usage(self) -> dict[str, int]:
        completion = sum(self._completion_tokens)
        return {"prompt_tokens": self._prompt_tokens, "completion_tokens": completion,
                "total_tokens": self._prompt_tokens + completion}

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self._chat \
            else "text_completion"
        return {"id": self._id, "object": kind, "created": self._created,
                "model": self._params.model}

    async def whole(self, pieces: AsyncIterator[Piece]) -> dict[str, Any]:
        texts = [""] * self._params.n
        entries: list[list[Entry]] = [[] for _ in range(self._params.n)]
        reasons: list[str | None] = [None] * self._params.n
        async with closing(pieces):
            async for piece in pieces:
                self._count(piece)
                texts[piece.index] += piece.text
                entries[piece.index] += piece.logprobs or []
                if piece.finish_reason is not None:
                    reasons[piece.index] = piece.finish_reason
        choices: list[dict[str, Any]] = []
        for index, (text, reason) in enumerate(zip(texts, reasons, strict=True)):
            if self._chat:
                choices.append({"index": index,
                                "message": {"role": "assistant", "content": text},
                                "logprobs": self._logprobs.document(index, entries[index]),
                                "finish_reason": reason})
            else:
                choices.append({"index": index, "text": text,
                                "logprobs": self._logprobs.document(index, entries[index]),
                                "finish_reason": reason})
        return {**self._head(False), "choices": choices, "usage": self._usage()}

    def _chunk(self, choice: dict[str, Any]) -> bytes:
        document = {**self._head(True), "choices": [choice]}
        if self._params.include_usage:
            document["usage"] = None
        return _event(document)

    def _choice_chunk(self, piece: Piece, role: bool) -> dict[str, Any]:
        if self._chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if piece.text or role:
                delta["content"] = piece.text
            return {"index": piece.index, "delta": delta,
                    "logprobs": self._logprobs.document(piece.index, piece.logprobs or None),
                    "finish_reason": piece.finish_reason}
        return {"index": piece.index, "text": piece.text,
                "logprobs": self._logprobs.document(piece.index, piece.logprobs or None),
                "finish_reason": piece.finish_reason}

    async def events(self, first: Piece | None, pieces: AsyncIterator[Piece]
                     ) -> AsyncIterator[bytes]:
        """SSE bytes. Leaving early (client gone) closes ``pieces``, cancelling the backend
        requests still running."""
        started = [False] * self._params.n
        async with closing(pieces):
            try:
                piece = first
                while piece is not None:
                    self._count(piece)
                    if self._chat and not started[piece.index]:  # the role, then the text
                        started[piece.index] = True
                        yield self._chunk(self._choice_chunk(
                            Piece(piece.index, "", 0, 0), role=True))
                    if piece.text or piece.logprobs or piece.finish_reason is not None:
                        yield self._chunk(self._choice_chunk(piece, role=False))
                    piece = await anext(pieces, None)
            except OpenAiError as error:
                yield _event(error.document())
            except ShoalError as error:
                yield _event(from_shoal_error(error).document())
            else:
                if self._params.include_usage:
                    yield _event({**self._head(True), "choices": [], "usage": self._usage()})
        yield b"data: [DONE]\n\n"


def _event(document: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(document) + b"\n\n"
