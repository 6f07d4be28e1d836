"""One OpenAI request -> one backend request per choice, on the ``llm`` backend's text form.

Each choice is a ``generate_stream``-like request built from a text-form document
(``text_input`` or ``messages``, ``max_tokens``, ``temperature``, ``top_p``, ``top_k`` 0 when
sampling, ``random_seed``, ``stream`` true) that asks for ``text_output``, ``prompt_tokens``,
``completion_tokens`` and ``finish_reason`` (``interface.py`` of the backend). The backend always
streams; the frontend applies stop strings to the text (``stops.py``) and, on a stop, leaves the
stream, which cancels the backend request (as a client disconnect does). Choices without a
``seed`` get a random one each; with a seed, choice ``i`` uses ``seed + i`` (reproducible, yet
``n`` sampled choices differ).

``choices`` merges the choices' pieces in arrival order; closing it (a finished response, a
client gone) cancels every backend request still running.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from shoal.errors import ShoalError
from shoal.frontend.core.decoded import OutputRequest
from shoal.frontend.core.prepare import closing, prepare_request
from shoal.frontend.core.validation import validate_request
from shoal.frontend.http.generate import decode_generate_request, output_value
from shoal.frontend.http.openai_api.errors import OpenAiError, invalid
from shoal.frontend.http.openai_api.logprobs import PARAM_OF_INPUT as LOGITS_PARAM_OF_INPUT
from shoal.frontend.http.openai_api.logprobs import (
    Entry,
    entries_of,
    require_extras_interface,
)
from shoal.frontend.http.openai_api.params import GenerationParams
from shoal.frontend.http.openai_api.response_format import openai_message, require_guide_inputs
from shoal.frontend.http.openai_api.stops import StopScanner
from shoal.messages import ModelVersionInfo

if TYPE_CHECKING:
    from shoal.frontend.core.dataplane import DataPlane

OUTPUTS: Final = ("text_output", "prompt_tokens", "completion_tokens", "finish_reason")
# backend input names -> the OpenAI parameter a backend error about them concerns
_PARAM_OF_INPUT: Final = LOGITS_PARAM_OF_INPUT | {"guided_decoding_guide": "response_format",
                          "max_tokens": "max_tokens", "text_input": "prompt",
                          "messages": "messages", "temperature": "temperature",
                          "top_p": "top_p", "random_seed": "seed"}


@dataclass(frozen=True)
class Piece:
    """New text of one choice; ``finish_reason`` is set on the choice's last piece."""

    index: int
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None
    logprobs: list[Entry] | None = None  # the new tokens' log-probabilities, when asked for


def require_interface(model: ModelVersionInfo, chat: bool) -> None:
    """400 when the model's config lacks what the OpenAI API sends or asks for."""
    inputs = {spec.name for spec in model.inputs}
    outputs = {spec.name for spec in model.outputs}
    needed_inputs = ("messages" if chat else "text_input", "max_tokens", "temperature",
                     "top_p", "top_k", "random_seed", "stream")
    missing = [f"input '{name}'" for name in needed_inputs if name not in inputs]
    missing += [f"output '{name}'" for name in OUTPUTS if name not in outputs]
    if missing:
        raise invalid(f"model '{model.name}' cannot serve this endpoint: its config lacks "
                      f"{', '.join(missing)} (see examples/llm_repository/llm/config.pbtxt)",
                      "model")


def backend_error(error: ShoalError) -> OpenAiError:
    """A backend / data-path error in OpenAI's shape, naming the parameter it concerns."""
    from shoal.frontend.http.errors import status_for

    param = next((p for name, p in _PARAM_OF_INPUT.items() if name in error.message), None)
    message = openai_message(error.message).replace("input 'text_input'", "'prompt'").replace(
        "input 'messages'", "'messages'")
    return OpenAiError(status_for(error.code), message, param=param)


class Generation:
    def __init__(self, dataplane: DataPlane, model: ModelVersionInfo,
                 params: GenerationParams) -> None:
        self._dataplane = dataplane
        self._model = model
        self._params = params
        require_guide_inputs(model, params.guide)
        require_extras_interface(model, params.extras)

    def choices(self) -> AsyncIterator[Piece]:
        streams = [self._choice(index) for index in range(self._params.n)]
        return streams[0] if len(streams) == 1 else _merged(streams)

    def _document(self, index: int) -> dict[str, Any]:
        params = self._params
        seed = secrets.randbits(63) if params.seed is None else (params.seed + index) % 2**63
        document: dict[str, Any] = {
            "messages" if params.chat else "text_input": params.prompt,
            "max_tokens": params.max_tokens, "temperature": params.temperature,
            "top_p": params.top_p, "random_seed": seed, "stream": True}
        if params.temperature > 0:
            document["top_k"] = 0  # sample (the executor is greedy when neither k nor p is set)
        if params.guide is not None:
            document |= params.guide.inputs()
        document |= params.extras.backend_inputs()
        return document

    async def _choice(self, index: int) -> AsyncIterator[Piece]:
        try:
            decoded = decode_generate_request(self._document(index), self._model)
            decoded.outputs = [OutputRequest(name)
                               for name in (*OUTPUTS, *self._params.extras.needed()[1])]
            plan = validate_request(decoded, self._model)
            prepared = prepare_request(self._dataplane, decoded, plan, self._model)
        except ShoalError as error:
            raise backend_error(error) from None
        scanner = StopScanner(self._params.stop)
        prompt = completion = 0
        reason = ""
        answers = self._dataplane.infer_stream(prepared.request, prepared.slots)
        async with closing(answers):
            async for outcome in answers:
                response = outcome.response
                try:
                    if response.error is not None:
                        raise backend_error(ShoalError(response.error.code,
                                                       response.error.message))
                    if response.empty:
                        continue
                    values = {ref.name: output_value(ref, self._dataplane.output_view(ref))
                              for ref in response.outputs}
                finally:
                    self._dataplane.release(response.lease)
                prompt = int(values.get("prompt_tokens", prompt))
                completion = int(values.get("completion_tokens", completion))
                reason = str(values.get("finish_reason") or reason)
                text = scanner.push(str(values.get("text_output", "")))
                entries = entries_of(values)
                if scanner.stopped:  # leaving the loop cancels the backend request
                    yield Piece(index, text, prompt, completion, "stop", entries)
                    return
                if text or entries:
                    yield Piece(index, text, prompt, completion, logprobs=entries)
        yield Piece(index, scanner.flush(), prompt, completion, _openai_reason(reason))


def _openai_reason(reason: str) -> str:
    return "length" if reason == "length" else "stop"


async def _merged(streams: list[AsyncIterator[Piece]]) -> AsyncIterator[Piece]:
    """Pieces of all ``streams`` as they come; an error in one ends all (closing this cancels
    the streams still running)."""
    queue: asyncio.Queue[Piece | BaseException | None] = asyncio.Queue()

    async def pump(stream: AsyncIterator[Piece]) -> None:
        try:
            async with closing(stream):
                async for piece in stream:
                    await queue.put(piece)
        except Exception as error:
            await queue.put(error)
            return
        await queue.put(None)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
