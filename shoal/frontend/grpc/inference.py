"""``ModelInfer`` and ``ModelStreamInfer``.

Both resolve the model, decode the request (``convert``), validate it with the HTTP path's checks,
place the inputs (``infer_common``) and hand the request to the DataPlane. Output memory lent by an
answer is released as soon as the answer is encoded (always, also on error).

Stream semantics (Triton's ``ModelStreamInferHandler``): requests are read in order and each is
served concurrently by its own task. Answers to non-decoupled requests (and errors found before a
model is known) are written in request order, each exactly once, marked final; a decoupled model
answers 0..N times as the DataPlane yields, interleaved with the rest. Every message carries
``parameters["triton_final_response"]``; errors go in-band (``error_message`` with the request's
id) and the stream stays open. A flags-only final answer of a decoupled model is sent (as an empty
response) only when the request set ``triton_enable_empty_final_response``.

Cancellation: grpc.aio cancels the handler when the client cancels or the deadline passes; the
unary handler's await of ``DataPlane.infer`` is then cancelled, and a stream cancels every task it
started (each awaiting ``infer`` or iterating ``infer_stream``), which cancels the requests at the
broker.

Messages: requests arrive as ``wire.InferRequestWire`` (a large request's raw inputs are views
of the received bytes) and answers leave as bytes (``encode``: each output copied once); the
method handlers with these (de)serializers are ``grpc/handlers.py``'s.

Tracing: each request (unary, or each message of a stream) is sampled with its model name. A
traced one is stamped GRPC_WAITREAD_START and GRPC_WAITREAD_END together when grpc.aio hands it
over (the wait for it is not visible here), GRPC_SEND_START / GRPC_SEND_END around its answer's
send (unary: from the handler's return to the call's end; a decoupled model: its final answer),
and goes to the tracer when its call (unary) or its task (stream) is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import grpc
from tritonclient.grpc import service_pb2 as pb

from shoal.errors import ErrorCode, ShoalError, unsupported
from shoal.frontend.core.header_forward import forwarded_parameters, with_forwarded
from shoal.frontend.core.prepare import PreparedRequest, closing, prepare_request
from shoal.frontend.core.validation import validate_request
from shoal.frontend.grpc.convert import DecodedGrpcRequest, decode_model_infer_request
from shoal.frontend.grpc.encode import (
    encode_infer_response,
    stream_error,
    stream_refusal,
    stream_reply,
)
from shoal.frontend.grpc.status import INTERNAL_ERROR_MESSAGE, status_for
from shoal.frontend.grpc.wire import InferRequestWire, wire_request
from shoal.trace.record import (
    GRPC_SEND_END,
    GRPC_SEND_START,
    GRPC_WAITREAD_END,
    GRPC_WAITREAD_START,
    RequestTrace,
    stamp_of,
)

if TYPE_CHECKING:
    from shoal.frontend.core.dataplane import DataPlane, InferOutcome
    from shoal.frontend.core.validation import InferPlan
    from shoal.messages import ModelVersionInfo, Params
    from shoal.trace.sampling import Tracer

logger = logging.getLogger(__name__)

# the stream header that makes an error end the stream with its gRPC status (Triton's)
GRPC_ERROR_HEADER: Final = "triton_grpc_error"
DECOUPLED_UNARY_MESSAGE: Final = (
    "ModelInfer RPC doesn't support models with decoupled transaction policy"
)


@dataclass(frozen=True, slots=True)
class _Call:
    """One request on its way: what encoding its answers needs."""

    model: ModelVersionInfo
    decoded: DecodedGrpcRequest
    plan: InferPlan
    prepared: PreparedRequest


class GrpcInference:
    def __init__(self, dataplane: DataPlane, tracer: Tracer | None = None,
                 header_forward: re.Pattern[str] | None = None) -> None:
        self.dataplane = dataplane
        self.tracer = tracer
        self.header_forward = header_forward  # --grpc-header-forward-pattern

    def forwarded(self, context: Any) -> Params:
        """The call's metadata the forward pattern passes on as request parameters."""
        if self.header_forward is None:
            return {}
        return forwarded_parameters(context.invocation_metadata() or (), self.header_forward)

    def sample(self, message: Any) -> RequestTrace | None:
        """The request's trace if it is sampled, stamped as read."""
        trace = self.tracer.sample(message.model_name) if self.tracer is not None else None
        if trace is not None:
            trace.stamp(GRPC_WAITREAD_START)
            trace.stamp(GRPC_WAITREAD_END)
        return trace

    def finish(self, trace: RequestTrace) -> None:
        if self.tracer is not None:
            self.tracer.finish(trace)

    def resolve_model(self, message: Any) -> ModelVersionInfo:
        return self.dataplane.model(message.model_name, message.model_version or None)

    def start(self, request: InferRequestWire, model: ModelVersionInfo,
              trace: RequestTrace | None = None, forwarded: Params | None = None) -> _Call:
        """Decode, validate, place the inputs (``forwarded``: parameters from the call's
        metadata). Raises ShoalError, leaving nothing allocated."""
        decoded = decode_model_infer_request(request.message, model, request.raw)
        if forwarded:
            with_forwarded(decoded.request.parameters, forwarded)
        plan = validate_request(decoded.request, model)
        prepared = prepare_request(self.dataplane, decoded.request, plan, model, trace)
        return _Call(model, decoded, plan, prepared)

    async def infer(self, call: _Call, trace: RequestTrace | None) -> InferOutcome:
        prepared = call.prepared
        if trace is None:
            return await self.dataplane.infer(prepared.request, prepared.slots)
        outcome = await self.dataplane.infer(prepared.request, prepared.slots, trace=trace)
        trace.capture_outputs(outcome.response.outputs, self.dataplane.output_view)
        return outcome

    def encode(self, call: _Call, outcome: InferOutcome, final: bool | None = None) -> bytes:
        """The answer's ModelInferResponse, serialized (with ``final``: a stream's
        ModelStreamInferResponse, marked so); releases the answer's output memory."""
        response = outcome.response
        try:
            return encode_infer_response(
                response,
                model_name=call.model.name,
                model_version=response.model_version or outcome.model.version,
                client_id=call.decoded.request.client_id,
                plan=call.plan,
                batching=outcome.model.max_batch_size > 0,
                output_view=self.dataplane.output_view,
                final=final,
            )
        finally:
            self.dataplane.release(response.lease)

    async def model_infer(self, request: InferRequestWire | Any, context: Any) -> bytes:
        """``request``: as received (or a whole ModelInferRequest)."""
        if not isinstance(request, InferRequestWire):
            request = wire_request(request)
        message = request.message
        trace = self.sample(message)
        if trace is not None:
            context.add_done_callback(lambda _: self._call_ended(trace))
        model = self.resolve_model(message)
        if model.decoupled:
            raise unsupported(DECOUPLED_UNARY_MESSAGE)
        call = self.start(request, model, trace, self.forwarded(context))
        reply = self.encode(call, await self.infer(call, trace))
        if trace is not None:
            trace.stamp(GRPC_SEND_START)
        return reply

    def _call_ended(self, trace: RequestTrace) -> None:
        if stamp_of(trace, GRPC_SEND_START):
            trace.stamp(GRPC_SEND_END)
        self.finish(trace)

    async def model_stream_infer(self, requests: AsyncIterator[Any], context: Any) -> None:
        await StreamSession(self, context).run(requests)


@dataclass(frozen=True, slots=True)
class _Turn:
    """A place in the stream's order of non-decoupled answers: write after ``previous`` is
    done, then set ``done``."""

    previous: asyncio.Future[None] | None
    done: asyncio.Future[None]


def grpc_error_requested(context: Any) -> bool:
    """The stream's metadata has ``triton_grpc_error: true`` (Triton's opt-in: the first error
    ends the stream with its gRPC status instead of travelling in-band)."""
    return any(key.lower() == GRPC_ERROR_HEADER and str(value).strip().lower() == "true"
               for key, value in (context.invocation_metadata() or ()))


class StreamSession:
    """One ModelStreamInfer call. All of it runs on the event loop; writes are serialized (grpc
    allows one at a time). Errors go in-band, each as its request's message; with the
    ``triton_grpc_error: true`` header the first one ends the stream instead, with the error's
    gRPC status and text (nothing is written after it)."""

    def __init__(self, inference: GrpcInference, context: Any) -> None:
        self._inference = inference
        self._context = context
        self._write_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_turn: asyncio.Future[None] | None = None
        self._grpc_error = grpc_error_requested(context)
        self._ended = False  # the stream was ended with an error status (triton_grpc_error)
        self._forwarded = inference.forwarded(context)  # the stream's metadata, for each request

    async def run(self, requests: AsyncIterator[Any]) -> None:
        try:
            try:
                async for received in requests:
                    if self._ended:
                        break
                    self._spawn(received if isinstance(received, InferRequestWire)
                                else wire_request(received))
            except Exception:
                if not self._ended:  # reading after the stream was ended may fail: expected
                    raise
            while self._tasks:
                await asyncio.wait(set(self._tasks))
        finally:
            for task in self._tasks:
                task.cancel()
            if self._tasks:
                await asyncio.wait(set(self._tasks))

    def _spawn(self, request: InferRequestWire) -> None:
        message = request.message
        model: ModelVersionInfo | None = None
        error: ShoalError | None = None
        try:
            model = self._inference.resolve_model(message)
        except ShoalError as exc:
            error = exc
        turn = None
        if model is None or not model.decoupled:
            turn = _Turn(self._last_turn, asyncio.get_running_loop().create_future())
            self._last_turn = turn.done
        trace = self._inference.sample(message)
        task = asyncio.create_task(self._serve(request, model, error, turn, trace))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, request: InferRequestWire, model: ModelVersionInfo | None,
                     error: ShoalError | None, turn: _Turn | None,
                     trace: RequestTrace | None = None) -> None:
        message = request.message
        try:
            if model is not None and model.decoupled:
                await self._serve_decoupled(request, model, trace)
                return
            code: ErrorCode | None
            if model is None:
                assert error is not None
                reply, code = self._refusal(message, error.message), error.code
            else:
                reply, code = await self._answer_once(request, model, trace)
            assert turn is not None
            await self._write_in_turn(turn, reply, trace, code)
        except Exception as exc:  # a bug: say so in-band, keep the stream
            logger.error("unexpected error serving a gRPC stream request", exc_info=exc)
            with contextlib.suppress(Exception):
                await self._write(self._error(message, INTERNAL_ERROR_MESSAGE),
                                  error=ErrorCode.INTERNAL)
        finally:
            if turn is not None and not turn.done.done():
                turn.done.set_result(None)
            if trace is not None:
                self._inference.finish(trace)

    async def _answer_once(self, request: InferRequestWire, model: ModelVersionInfo,
                           trace: RequestTrace | None = None) -> tuple[Any, ErrorCode | None]:
        """The serialized answer, or an in-band error message (a refusal before the request is
        issued, or the error response it got) and its error's code."""
        try:
            call = self._inference.start(request, model, trace, self._forwarded)
        except ShoalError as error:
            return self._refusal(request.message, error.message), error.code
        try:
            outcome = await self._inference.infer(call, trace)
            return self._inference.encode(call, outcome, final=True), None
        except ShoalError as error:
            return self._error(request.message, error.message), error.code

    async def _serve_decoupled(self, request: InferRequestWire, model: ModelVersionInfo,
                               trace: RequestTrace | None = None) -> None:
        try:
            call = self._inference.start(request, model, trace, self._forwarded)
        except ShoalError as error:
            await self._write(self._refusal(request.message, error.message), error=error.code)
            return
        message = request.message
        issued = False  # an answer came: the DataPlane admitted it
        try:
            prepared = call.prepared
            answers = (self._inference.dataplane.infer_stream(prepared.request, prepared.slots)
                       if trace is None else self._inference.dataplane.infer_stream(
                           prepared.request, prepared.slots, trace=trace))
            async with closing(answers):
                async for outcome in answers:
                    issued = True
                    reply = self._decoupled_reply(call, outcome, message)
                    failed = outcome.response.error
                    if reply is not None:
                        await self._write(reply, trace if outcome.response.final else None,
                                          error=failed.code if failed is not None else None)
        except ShoalError as error:
            if issued:  # e.g. an answer that cannot be encoded: the request's last message
                await self._write(self._error(message, error.message), trace, error=error.code)
            else:  # the DataPlane refused to issue it (admission)
                await self._write(self._refusal(message, error.message), error=error.code)

    def _decoupled_reply(self, call: _Call, outcome: InferOutcome, message: Any) -> Any:
        """The message for one answer of a decoupled model to request ``message``; None for a
        flags-only final the client did not ask to see. An error response and the empty final
        carry the model name and version as the request gave them, as Triton's."""
        response = outcome.response
        if response.error is None and not response.empty:
            return self._inference.encode(call, outcome, final=response.final)
        self._inference.dataplane.release(response.lease)
        if response.error is not None:
            return self._error(message, response.error.message, final=response.final)
        if not call.decoded.empty_final_response:
            return None
        empty = pb.ModelInferResponse(id=message.id, model_name=message.model_name,
                                      model_version=message.model_version)
        return stream_reply(empty, response.final)

    @staticmethod
    def _error(message: Any, text: str, final: bool = True) -> Any:
        return stream_error(text, client_id=message.id, model_name=message.model_name,
                            model_version=message.model_version, final=final)

    @staticmethod
    def _refusal(message: Any, text: str) -> Any:
        return stream_refusal(text, client_id=message.id)

    async def _write_in_turn(self, turn: _Turn, reply: Any,
                             trace: RequestTrace | None = None,
                             error: ErrorCode | None = None) -> None:
        if turn.previous is not None:
            await asyncio.wait({turn.previous})  # (wait, not await: never cancel the future)
        await self._write(reply, trace, error)

    async def _write(self, reply: Any, trace: RequestTrace | None = None,
                     error: ErrorCode | None = None) -> None:
        """Write one message; a ``trace`` (a traced request's last answer) is stamped around
        the write. ``error``: the message is an error with this code; under
        ``triton_grpc_error`` it ends the stream with that status instead of being written.
        Nothing is written once the stream has ended."""
        async with self._write_lock:
            if self._ended:
                return
            if error is not None and self._grpc_error:
                self._ended = True
                with contextlib.suppress(grpc.aio.AbortError):
                    await self._context.abort(status_for(error), reply.error_message)
                return
            if trace is not None:
                trace.stamp(GRPC_SEND_START)
            await self._context.write(reply)
            if trace is not None:
                trace.stamp(GRPC_SEND_END)
