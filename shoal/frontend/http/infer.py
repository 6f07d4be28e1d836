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
from typing import TYPE_CHECKING, Final

from starlette.requests import Request
from starlette.responses import Response

from shoal.errors import unsupported
from shoal.frontend.http import compression
from shoal.frontend.http.codec import DecodedRequest, decode_infer_request
from shoal.frontend.http.response import encode_infer_response
from shoal.frontend.http.validation import InferPlan, validate_request
from shoal.frontend.infer_common import prepare_request
from shoal.messages import ModelVersionInfo

if TYPE_CHECKING:
    from shoal.frontend.dataplane import DataPlane
    from shoal.trace.record import RequestTrace

logger = logging.getLogger(__name__)

HEADER_LENGTH: Final = "inference-header-content-length"
TRACE_SCOPE_KEY: Final = "shoal.trace"  # the request's RequestTrace, when it is traced


async def read_body(request: Request, limit: int) -> bytes:
    """The whole request body; INVALID_ARG as soon as it is known to exceed ``limit``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
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

    def __init__(self, dataplane: DataPlane, max_input_bytes: int) -> None:
        self._dataplane = dataplane
        self._limit = max_input_bytes

    async def __call__(self, request: Request) -> Response:
        version = request.path_params.get("version")
        model = self._dataplane.model(
            request.path_params["model"], None if version is None else str(version)
        )
        if model.decoupled:
            raise unsupported(
                "HTTP end point doesn't support models with decoupled transaction policy"
            )
        encoding = compression.request_encoding(request.headers.get("content-encoding"))
        body = await read_body(request, self._limit)
        if encoding is not None:
            body = compression.decompress(body, encoding, self._limit)
        decoded = decode_infer_request(body, request.headers.get(HEADER_LENGTH), model,
                                       self._limit)
        plan = validate_request(decoded, model)
        content, headers = await self._run(decoded, plan, model,
                                           request.scope.get(TRACE_SCOPE_KEY))
        reply_encoding = compression.response_encoding(request.headers.get("accept-encoding"))
        if reply_encoding is not None:
            content = compression.compress(content, reply_encoding)
            headers["Content-Encoding"] = reply_encoding
        return Response(content, 200, headers)

    async def _run(
        self, decoded: DecodedRequest, plan: InferPlan, model: ModelVersionInfo,
        trace: RequestTrace | None = None,
    ) -> tuple[bytes, dict[str, str]]:
        dataplane = self._dataplane
        prepared = prepare_request(dataplane, decoded, plan, model, trace)
        if trace is None:
            outcome = await dataplane.infer(prepared.request, prepared.slots)
        else:
            outcome = await dataplane.infer(prepared.request, prepared.slots, trace=trace)
            trace.capture_outputs(outcome.response.outputs, dataplane.output_view)
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
        finally:
            dataplane.release(outcome.response.lease)
        if encoded.has_binary:
            return encoded.body, {
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(encoded.json_length),
            }
        return encoded.body, {"Content-Type": "application/json"}
