"""Triton's generate extension: ``POST /v2/models/<m>[/versions/<v>]/generate`` and
``.../generate_stream`` (provisional in Triton; HTTP only).

Request: one JSON object, read member by member in order as Triton reads it (a key given twice is
two members). A member that names a model input becomes that input; ``parameters`` (unless an
input has that name, which Triton refuses) is an object whose members are read the same way, with
errors prefixed ``Converting keyword: 'parameters': ``; ``id`` (a string) is the request id;
every other member is a request parameter, with infer's rules for the reserved ones
(``sequence_id``, ``priority``, ``triton_*`` ...). An input given twice is INVALID_ARG
"[request id: <id>] input 'X' already exists in request".

An input's value is a scalar or an array; its shape is fitted to the model's metadata shape (the
config's ``dims``, after a ``-1`` batch dimension when the model batches), Triton's rule: with
``n`` the number of elements (an array's length, 1 for a scalar), going from the innermost
dimension out each fixed dimension must divide ``n`` and takes its share; then the innermost
``-1`` gets what is left and every other ``-1`` is 1; nothing left to place in a shape with no
``-1`` must be 1. Otherwise INVALID_ARG "The schema can not convert input 'X' to tensor with
proper shape". So ``"hi"`` fits ``[1, 1]`` and ``[4]`` values fit ``[2, 2]``. Values of the wrong
JSON type get Triton's texts (``attempt to access JSON non-string as string`` ...; checked
before the shape for BYTES, after it for the rest, as Triton does). The request is then
validated like an infer request (same messages). An ``llm``-backend model's prompt over its byte
limit is refused first (INVALID_ARG naming the limit: ``prompt_size.py``).

Response: ``{<name>: value, ...}`` over the outputs, the response's parameters, ``id`` (when
set), ``model_name`` and ``model_version``, in the byte order of the names as Triton writes
them (a reserved name wins over an output of that name); a 1-element output is unwrapped to a
scalar, BYTES become strings. ``/generate`` answers once (``application/json``); anything but
exactly one response (errors count) is "generate expects model to produce exactly 1
response ...". ``/generate_stream`` answers with Server-Sent Events (``text/event-stream;
charset=utf-8``), one ``data: {json}`` event per response, an error response as
``data: {"error": "..."}``, and goes on until the model's final response.

Status (Triton's): an error found before the request leaves (unknown model, bad input, arena
full) is a JSON error with its code's status. The status of an answer is decided by the first
response: 200 for a response, 400 for an error response of the model (whatever its code, as
Triton's generate endpoint answers them; for generate_stream still as an event stream), except
that a refusal of the server (UNAVAILABLE: queue full, model unloading, exiting; NOT_FOUND) keeps
its status as a JSON error, as Triton refuses those before it answers. One deliberate
difference: a /generate whose first response is fine but that gets more or none answers 501
(Triton sends its error text with 200).

Ownership: output memory of each answer is released as soon as it is converted; leaving the
stream early (client gone) closes the DataPlane's iterator, which cancels the request.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from shoal import dtypes
from shoal.errors import ErrorCode, ShoalError, invalid_arg
from shoal.frontend.core.decoded import DecodedInput, DecodedRequest
from shoal.frontend.core.prepare import closing, prepare_request
from shoal.frontend.core.validation import duplicate_input, tagged, validate_request
from shoal.frontend.http.codec import decode_request_parameters
from shoal.frontend.http.errors import error_response, shoal_error_response, status_for
from shoal.frontend.http.infer import read_body
from shoal.frontend.http.json_tensors import flatten, json_tensor_bytes, json_type_error
from shoal.frontend.http.jsonparse import parse_json_pairs
from shoal.frontend.http.prompt_size import check_prompt_size
from shoal.frontend.http.response import json_data
from shoal.messages import InferRequest, InferResponse, ModelVersionInfo, TensorRef, TensorSpec

if TYPE_CHECKING:
    from shoal.frontend.core.dataplane import DataPlane, InferOutcome
    from shoal.shm.arena import Slot

SSE_CONTENT_TYPE: Final = "text/event-stream; charset=utf-8"
JSON_CONTENT_TYPE: Final = "application/json"
NESTED_KEY: Final = "parameters"
ONE_RESPONSE_ERROR: Final = ("generate expects model to produce exactly 1 response, use generate "
                             "stream for model that generates various number of responses")
# refusals of the server rather than answers of the model: they keep their status (module doc)
_REFUSALS: Final = frozenset({ErrorCode.UNAVAILABLE, ErrorCode.NOT_FOUND})
_ANSWER_ERROR_STATUS: Final = 400
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_UINT64_MAX: Final = (1 << 64) - 1
# an answer's names in byte order, Triton's (UTF-8 byte order is code point order: sorted()'s)
_DUMP_OPTIONS: Final = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS


class JsonMembers(tuple[tuple[str, Any], ...]):
    """A JSON object as its members in order, duplicates kept (``json``'s
    ``object_pairs_hook``). A tuple, so that no JSON array (a list) is taken for one."""


def parse_generate_body(body: bytes | memoryview) -> JsonMembers:
    """The request body's members, every one kept (orjson keeps only the last of a duplicated
    key), with ``parse_json_object``'s limits and error texts."""
    return parse_json_pairs(body, "generate request", JsonMembers)


def decode_generate_request(document: Mapping[str, Any] | JsonMembers,
                            model: ModelVersionInfo) -> DecodedRequest:
    """The generate JSON object -> DecodedRequest (raises INVALID_ARG; module doc)."""
    specs = {spec.name: spec for spec in model.inputs}
    batching = model.max_batch_size > 0
    members = _members(document)
    request = DecodedRequest(inputs=[])
    for key, value in members:  # Triton reads the (first) request id before anything else
        if key == "id" and key not in specs:
            if not isinstance(value, str):
                raise invalid_arg("Unable to parse 'id': attempt to access JSON non-string as "
                                  "string")
            request.client_id = value
            break
    parameters: dict[str, Any] = {}
    nested: dict[str, Any] = {}
    for key, value in members:
        if key == NESTED_KEY:
            if key in specs:
                raise invalid_arg(f"Keyword '{key}' for nested schema also given as input "
                                  "tensor name")
            if not isinstance(value, JsonMembers | dict):
                raise invalid_arg(f"Expected JSON object for keyword: '{key}': attempt to "
                                  "access JSON non-object as object")
            try:
                for inner_key, inner_value in _members(value):
                    if inner_key in specs:
                        _add_input(request, specs[inner_key], inner_value, batching)
                    else:
                        nested[inner_key] = inner_value
            except ShoalError as error:
                raise _converting(key, error) from None
        elif key in specs:
            _add_input(request, specs[key], value, batching)
        elif key != "id":
            parameters[key] = value
    decode_request_parameters(parameters, request)
    try:
        decode_request_parameters(nested, request)
    except ShoalError as error:
        raise _converting(NESTED_KEY, error) from None
    check_prompt_size(request, model)  # an llm model's prompt bytes, before any tokenizing
    return request


def _members(document: Mapping[str, Any] | JsonMembers) -> Iterable[tuple[str, Any]]:
    return document if isinstance(document, JsonMembers) else document.items()


def _converting(key: str, error: ShoalError) -> ShoalError:
    return ShoalError(error.code, f"Converting keyword: '{key}': {error.message}")


def _add_input(request: DecodedRequest, spec: TensorSpec, value: Any, batching: bool) -> None:
    tensor = _input_tensor(spec, value, batching)
    if any(existing.name == spec.name for existing in request.inputs):
        raise tagged(duplicate_input(spec.name), request.client_id)  # Triton's core text
    request.inputs.append(tensor)


def _input_tensor(spec: TensorSpec, value: Any, batching: bool) -> DecodedInput:
    is_array = isinstance(value, list)
    leaves = flatten(value) if is_array else [value]
    types_first = spec.datatype == "BYTES"  # Triton sizes BYTES data before the shape
    if types_first:
        _check_leaf_types(leaves, spec.datatype)
    shape = fit_shape(spec, len(value) if is_array else 1, batching)
    if not types_first:
        _check_leaf_types(leaves, spec.datatype)
    count = dtypes.element_count(shape)
    data = json_tensor_bytes(leaves, spec.datatype, count, spec.name)
    return DecodedInput(spec.name, spec.datatype, shape, data, count)


def fit_shape(spec: TensorSpec, count: int, batching: bool) -> list[int]:
    """Triton's generate rule (module doc): the shape ``count`` elements take in the input's
    metadata shape; INVALID_ARG when they cannot."""
    shape = ([-1] if batching else []) + list(spec.dims)
    left = count
    for dim in reversed(shape):
        if dim != -1:
            if dim == 0 or left % dim:
                raise _unfit(spec.name)
            left //= dim
    for index in range(len(shape) - 1, -1, -1):
        if shape[index] == -1:
            shape[index], left = left, 1
    if left != 1:
        raise _unfit(spec.name)
    return shape


def _unfit(name: str) -> ShoalError:
    return invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")


def _check_leaf_types(leaves: list[Any], datatype: str) -> None:
    """Triton's JSON type errors for values a datatype cannot take (ranges are checked when
    the bytes are made)."""
    if datatype == "BYTES":
        ok = all(isinstance(v, str) for v in leaves)
    elif datatype == "BOOL":
        ok = all(isinstance(v, bool) for v in leaves)
    elif datatype in ("FP16", "BF16"):
        return  # refused as JSON whatever the values (json_tensor_bytes)
    elif (kind := dtypes.numpy_dtype(datatype).kind) == "i":
        ok = all(type(v) is int and _INT64_MIN <= v <= _INT64_MAX for v in leaves)
    elif kind == "u":
        ok = all(type(v) is int and 0 <= v <= _UINT64_MAX for v in leaves)
    else:
        ok = all(type(v) in (int, float) for v in leaves)
    if not ok:
        raise json_type_error(datatype)


def output_value(ref: TensorRef, view: memoryview) -> Any:
    """An output as a generate JSON value: a flat list, or its one element."""
    value = json_data(ref.name, ref.datatype, list(ref.shape), view)  # refuses FP16/BF16
    if dtypes.element_count(ref.shape) != 1:
        return value
    if ref.datatype == "BYTES":
        return value[0]
    element = np.frombuffer(view, dtypes.numpy_dtype(ref.datatype), 1).item()
    if isinstance(element, float) and not math.isfinite(element):
        return value[0]  # the string "NaN" / "Infinity" / "-Infinity", as infer writes it
    return element


@dataclass(frozen=True, slots=True)
class _Event:
    """One response of the model as generate writes it: a document, or an error response
    (``error`` set, ``document`` its ``{"error"}``). Written with its names sorted
    (``_DUMP_OPTIONS``)."""

    document: dict[str, Any]
    error: ShoalError | None = None

    @property
    def refused(self) -> bool:
        """A refusal of the server (module doc): answered as a plain JSON error."""
        return self.error is not None and self.error.code in _REFUSALS


class GenerateHandler:
    """Serves ``generate`` (``streaming`` False) or ``generate_stream`` for one DataPlane."""

    def __init__(self, dataplane: DataPlane, max_input_bytes: int, streaming: bool) -> None:
        self._dataplane = dataplane
        self._limit = max_input_bytes
        self._streaming = streaming

    async def __call__(self, request: Request) -> Response:
        version = request.path_params.get("version")
        model = self._dataplane.model(request.path_params["model"],
                                      None if version is None else str(version))
        body = await read_body(request, self._limit)
        decoded = decode_generate_request(parse_generate_body(body), model)
        plan = validate_request(decoded, model)
        prepared = prepare_request(self._dataplane, decoded, plan, model)
        events = self._events(self._answers(model, prepared.request, prepared.slots),
                              decoded.client_id)
        if not self._streaming:
            return await _single(events)
        first = await _first(events)
        if first is None:
            return StreamingResponse(_no_events(), media_type=SSE_CONTENT_TYPE)
        if first.refused:
            await events.aclose()
            assert first.error is not None
            return shoal_error_response(first.error)
        status = 200 if first.error is None else _ANSWER_ERROR_STATUS
        return StreamingResponse(_sse(first, events), status, media_type=SSE_CONTENT_TYPE)

    async def _answers(self, model: ModelVersionInfo, infer_request: InferRequest,
                       slots: list[Slot]) -> AsyncIterator[InferOutcome]:
        """The DataPlane's answers (a non-decoupled model answers once); closing this early
        cancels the request."""
        if not model.decoupled:
            yield await self._dataplane.infer(infer_request, slots)
            return
        async with closing(self._dataplane.infer_stream(infer_request, slots)) as answers:
            async for outcome in answers:
                yield outcome

    async def _events(self, answers: AsyncIterator[InferOutcome], client_id: str
                      ) -> AsyncGenerator[_Event, None]:
        """One event per answer that carries a response, until the final one. An error the
        DataPlane raises (a refusal, or a plain model's error answer) ends them as an event."""
        async with closing(answers):
            try:
                async for outcome in answers:
                    response = outcome.response
                    try:
                        if response.error is not None:
                            error = ShoalError(response.error.code, response.error.message)
                            event = _Event({"error": error.message}, error)
                        elif response.empty:
                            continue
                        else:
                            event = _Event(self._document(outcome, response, client_id))
                    finally:
                        self._dataplane.release(response.lease)
                    yield event
            except ShoalError as error:
                yield _Event({"error": error.message}, error)

    def _document(self, outcome: InferOutcome, response: InferResponse,
                  client_id: str) -> dict[str, Any]:
        """Triton's generate answer, the reserved names first in a clash (written with its
        names in byte order: ``_DUMP_OPTIONS``)."""
        fields: dict[str, Any] = {}
        if client_id:
            fields["id"] = client_id
        fields["model_name"] = outcome.model.name
        fields["model_version"] = str(response.model_version or outcome.model.version)
        for key, value in response.parameters.items():
            fields.setdefault(key, value)
        for ref in response.outputs:
            if ref.name not in fields:
                fields[ref.name] = output_value(ref, self._dataplane.output_view(ref))
        return fields


async def _single(events: AsyncIterator[_Event]) -> Response:
    """``/generate``: exactly one response, else Triton's error text (module doc)."""
    found: list[_Event] = []
    async with closing(events):
        async for event in events:
            found.append(event)
            if len(found) > 1:
                break  # no need to wait for the rest: closing cancels the request
    if len(found) == 1 and found[0].error is None:
        return Response(orjson.dumps(found[0].document, option=_DUMP_OPTIONS), 200,
                        media_type=JSON_CONTENT_TYPE)
    first = found[0] if found else None
    if first is not None and first.error is not None:
        if first.refused:
            return shoal_error_response(first.error)
        message = first.error.message if len(found) == 1 else ONE_RESPONSE_ERROR
        return error_response(_ANSWER_ERROR_STATUS, message)
    return error_response(status_for(ErrorCode.UNSUPPORTED), ONE_RESPONSE_ERROR)


async def _first(events: AsyncIterator[_Event]) -> _Event | None:
    """The first event, None when the model sent no response (the iterator is then done)."""
    try:
        return await anext(events)
    except StopAsyncIteration:
        return None


def _event_bytes(document: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(document, option=_DUMP_OPTIONS) + b"\n\n"


async def _no_events() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that yields nothing


async def _sse(first: _Event, events: AsyncIterator[_Event]) -> AsyncIterator[bytes]:
    """SSE bytes of every event, error responses included, until the final response. Leaving
    early (client gone) closes ``events`` and so cancels the request."""
    async with closing(events):
        yield _event_bytes(first.document)
        async for event in events:
            yield _event_bytes(event.document)
