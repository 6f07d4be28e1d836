"""``POST /v2/models/<m>[/versions/<v>]/infer``: the hot path.

Order: resolve the model, read the body (bounded), decompress (bounded), decode, validate, and
only then place input bytes in shared memory and hand the request to the DataPlane. Input slots
are ours until ``DataPlane.infer`` takes them (it frees them); on any error before that we free
them. The outcome's output memory is lent to us until ``DataPlane.release``, which always runs.
Tensors in client-registered regions (``shared_memory_*`` parameters) are resolved through
``DataPlane.shared_memory`` under the request's id: no slot, no copy; the DataPlane releases the
regions when the request ends, we do if it never reaches ``infer``.

A request the fast path sampled for tracing carries its ``RequestTrace`` in the scope
(``TRACE_SCOPE_KEY``): it is stamped REQUEST_START as it leaves for the broker, gets the
broker's stamps and REQUEST_END with the answer, and (level TENSORS) copies of its tensors.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from starlette.requests import Request
from starlette.responses import Response

from shoal.errors import unsupported
from shoal.frontend.core.decoded import DecodedRequest
from shoal.frontend.core.header_forward import forwarded_parameters, with_forwarded
from shoal.frontend.core.prepare import BodySlot, prepare_request
from shoal.frontend.core.validation import InferPlan, validate_request
from shoal.frontend.http import compression
from shoal.frontend.http.codec import decode_infer_request
from shoal.frontend.http.response import encode_infer_response
from shoal.messages import Lease, ModelVersionInfo

if TYPE_CHECKING:
    from shoal.frontend.core.dataplane import DataPlane
    from shoal.trace.record import RequestTrace

logger = logging.getLogger(__name__)

HEADER_LENGTH: Final = "inference-header-content-length"
# the infer route as Triton matches it (the Starlette route, the ASGI fast path, the lean transport)
INFER_PATH: Final = re.compile(r"^/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer$")
TRACE_SCOPE_KEY: Final = "shoal.trace"  # the request's RequestTrace, when it is traced
# an answer at least this long whose body came in an arena slot is sent from the worker's
# memory (no join); smaller ones are joined, so the lease goes back before the write
ZERO_COPY_MIN_BYTES: Final = 1 << 20


async def read_body(request: Request, limit: int) -> bytes:
    """The whole request body; INVALID_ARG as soon as it is known to exceed ``limit``. A
    chunked body's Content-Length (``connection.request_parser``) is not looked at."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit \
            and "transfer-encoding" not in request.headers:
        raise compression.size_limit_error(int(declared), limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise compression.size_limit_error(size, limit)
        if chunk:
            chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class InferHandler:
    """Serves the infer route for one DataPlane; ``max_input_bytes`` bounds the body (before and
    after decompression) and the total input tensor bytes."""

    def __init__(self, dataplane: DataPlane, max_input_bytes: int,
                 header_forward: re.Pattern[str] | None = None) -> None:
        self._dataplane = dataplane
        self._limit = max_input_bytes
        self._header_forward = header_forward  # --http-header-forward-pattern

    async def __call__(self, request: Request) -> Response:
        version = request.path_params.get("version")
        model = self.resolve(request.path_params["model"],
                             None if version is None else str(version))
        encoding = compression.request_encoding(request.headers.get("content-encoding"))
        body = await read_body(request, self._limit)
        reply = await self.answer(model, body, encoding, request.headers,
                                  request.scope.get(TRACE_SCOPE_KEY))
        return Response(reply.joined(), 200, reply.headers)

    def resolve(self, name: str, version: str | None) -> ModelVersionInfo:
        """The model the URL names; HTTP refuses decoupled models (Triton's message)."""
        model = self._dataplane.model(name, version)
        if model.decoupled:
            raise unsupported(
                "HTTP end point doesn't support models with decoupled transaction policy"
            )
        return model

    async def answer(
        self, model: ModelVersionInfo, body: bytes | bytearray | memoryview,
        encoding: compression.Encoding | None, headers: Mapping[str, str],
        trace: RequestTrace | None = None, body_slot: BodySlot | None = None,
    ) -> InferReply:
        """Serve one infer request whose whole body is read: decompress, decode, validate, run,
        encode (compressed when ``Accept-Encoding`` asks). ``headers`` are looked up by lower-case
        name. ``body_slot``: the body already lies in this arena slot (``body`` is its view);
        it is ours from the call on (freed here on a failure, else with the request)."""
        try:
            if encoding is not None:
                body = compression.decompress(body, encoding, self._limit)
            decoded = decode_infer_request(body, headers.get(HEADER_LENGTH.lower()), model,
                                           self._limit)
            if self._header_forward is not None:
                with_forwarded(decoded.parameters,
                               forwarded_parameters(headers.items(), self._header_forward))
            plan = validate_request(decoded, model)
        except BaseException:
            if body_slot is not None:
                self._dataplane.free(body_slot.slot)
            raise
        reply = await self._run(decoded, plan, model, trace, body_slot,
                                zero_copy=encoding is None and body_slot is not None)
        reply_encoding = compression.response_encoding(headers.get("accept-encoding"))
        if reply_encoding is not None:
            content = reply.joined()
            reply.release()
            reply.parts = [compression.compress(content, reply_encoding)]
            reply.headers["Content-Encoding"] = reply_encoding
        return reply

    async def _run(
        self, decoded: DecodedRequest, plan: InferPlan, model: ModelVersionInfo,
        trace: RequestTrace | None, body_slot: BodySlot | None, zero_copy: bool,
    ) -> InferReply:
        dataplane = self._dataplane
        prepared = prepare_request(dataplane, decoded, plan, model, trace, body_slot)
        if trace is None:
            outcome = await dataplane.infer(prepared.request, prepared.slots)
        else:
            outcome = await dataplane.infer(prepared.request, prepared.slots, trace=trace)
            trace.capture_outputs(outcome.response.outputs, dataplane.output_view)
        lease = outcome.response.lease
        try:
            encoded = encode_infer_response(
                outcome.response,
                model_name=model.name,
                model_version=outcome.response.model_version or outcome.model.version,
                client_id=decoded.client_id,
                plan=plan,
                batching=outcome.model.max_batch_size > 0,
                output_view=dataplane.output_view,
            )
        except BaseException:
            dataplane.release(lease)
            raise
        reply = InferReply(encoded.parts, encoded.length, dataplane, lease)
        if not (zero_copy and encoded.length >= ZERO_COPY_MIN_BYTES):
            reply.parts = [encoded.joined()]  # small: one copy now, the lease goes back at once
            reply.release()
        if encoded.has_binary:
            reply.headers["Content-Type"] = "application/octet-stream"
            reply.headers["Inference-Header-Content-Length"] = str(encoded.json_length)
        else:
            reply.headers["Content-Type"] = "application/json"
        return reply


class InferReply:
    """An infer answer ready to send: ``parts`` in order (``length`` bytes in all) and its
    headers. Parts may be views of the worker's output memory: then ``release`` (idempotent)
    must run once they are written (the lean transport waits for the write to drain); the
    Starlette route calls ``joined`` and releases at once."""

    __slots__ = ("_dataplane", "_lease", "headers", "parts")

    def __init__(self, parts: list[bytes | memoryview], length: int, dataplane: DataPlane,
                 lease: Lease | None) -> None:
        self.parts = parts
        self.headers: dict[str, str] = {}
        self._dataplane = dataplane
        self._lease = lease

    @property
    def holds_output_memory(self) -> bool:
        return self._lease is not None

    def joined(self) -> bytes:
        """The whole body as one bytes (a copy when it has several parts); releases the lease."""
        parts = self.parts
        body = parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts)
        self.parts = [body]
        self.release()
        return body

    def release(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            self._dataplane.release(lease)
