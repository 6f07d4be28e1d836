"""A decoupled model's responses: the worker's ``<identity>#s`` socket (docs/architecture.md §3
"Decoupled models", §7 "Worker").

``DecoupledStreams`` keeps the requests of a decoupled model that are still answering (opened
by ``batch_requests.BatchRequests`` as it builds them) and sends each response the model gives
through ``InstanceContext.send_response`` as a ``StreamResponse``: its outputs copied into the
worker's output arena (or the client's region) by the worker's ``OutputWriter``, then sent.

Contracts:
- ``send_response`` may run on any thread; every send and every arena write happens under the
  worker's ``output_lock`` (shared with the main thread, which writes batch results under it).
  A response after the final one is refused with INVALID_ARG; the final one forgets the
  request and its cancellation flag (``cancelled``, the worker's set, shared with the control
  thread).
- ``stream_batch``: inside the block, this thread's responses are held and leave at its end as
  one ``StreamResponses`` message (one send, one broker turn); nested blocks send at the
  outermost end.
- ``finish_batch``: ``execute`` returned; the ``BatchResult`` lists only the requests that
  ended (an error, or a direct response, which is sent as the final stream response), plus the
  rescheduled ones, whose streams stay open.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec
import zmq

from shoal.errors import ErrorCode, ShoalError
from shoal.messages import (
    Batch,
    BatchResult,
    BatchTimings,
    Error,
    Result,
    StreamResponse,
    StreamResponses,
    WorkerRequest,
    encode,
)
from shoal.workers.backends.base import Answer, BackendRequest, BackendResponse, Rescheduled
from shoal.workers.device_regions import DeviceRegions
from shoal.workers.outputs import OutputWriter, error_of


class DecoupledStreams:
    def __init__(self, socket: zmq.Socket[bytes], output_lock: threading.Lock,
                 outputs: OutputWriter, device_regions: DeviceRegions,
                 cancelled: set[int]) -> None:
        self._socket = socket
        self._output_lock = output_lock
        self._outputs = outputs
        self._device_regions = device_regions
        self._cancelled = cancelled
        # requests still answering: execution id -> the request (outputs wanted)
        self._open: dict[int, WorkerRequest] = {}
        self._held = threading.local()  # .messages: responses held by stream_batch

    def open(self, request: WorkerRequest) -> None:
        """``request`` answers through ``send_response`` from now until its final response."""
        self._open[request.request_id] = request

    def finish_batch(self, batch: Batch, requests: list[BackendRequest],
                     responses: list[Answer], errors: dict[int, Error],
                     timings: BatchTimings) -> BatchResult:
        """execute() returned: the instance is free again; requests that got an error (or a
        direct response, which a decoupled model should not return) end now, the rest keep
        answering through send_response. The BatchResult lists only requests that ended."""
        ended: list[Result] = []
        for request_id, error in errors.items():
            ended.append(Result(request_id, error=error))
        rescheduled: list[int] = []  # their streams stay open; the broker runs them again
        for request, response in zip(requests, responses, strict=True):
            if isinstance(response, Rescheduled):
                rescheduled.append(request.request_id)
            elif response is not None and request.request_id in self._open:
                self.send_response(request.request_id, response, True)
        # compute_output: from execute's return to here (the ended answers' work), as Triton
        # times the output phase after execute for a decoupled model too
        executed = timings.start_ns + timings.compute_input_ns + timings.compute_infer_ns
        timings = msgspec.structs.replace(timings, compute_output_ns=time.monotonic_ns()
                                          - executed)
        return BatchResult(batch.batch_id, ended, timings, rescheduled=rescheduled)

    def send_response(self, request_id: int, response: BackendResponse | Error | None,
                      final: bool) -> None:
        """InstanceContext.send_response: any thread, serialized by output_lock."""
        with self._output_lock:
            request = self._open.get(request_id)
            if request is None:
                raise ShoalError(ErrorCode.INVALID_ARG,
                                 "the request has already been sent its final response")
            message = self._stream_message(request, response, final)
            if final:
                del self._open[request_id]
                self._cancelled.discard(request_id)
            held: list[StreamResponse] | None = getattr(self._held, "messages", None)
            if held is not None:
                held.append(message)
            else:
                self._socket.send_multipart(encode(message))

    @contextmanager
    def stream_batch(self) -> Iterator[None]:
        """InstanceContext.stream_batch: this thread's responses inside the block leave as one
        StreamResponses message at its end (one send and one broker turn instead of many)."""
        if getattr(self._held, "messages", None) is not None:  # nested: the outer sends
            yield
            return
        held: list[StreamResponse] = []
        self._held.messages = held
        try:
            yield
        finally:
            self._held.messages = None
            if held:
                with self._output_lock:
                    self._socket.send_multipart(encode(
                        held[0] if len(held) == 1 else StreamResponses(held)))

    def _stream_message(self, request: WorkerRequest, response: BackendResponse | Error | None,
                        final: bool) -> StreamResponse:
        rid = request.request_id
        if response is None:
            return StreamResponse(rid, final=final, empty=True)
        if isinstance(response, Error):
            return StreamResponse(rid, error=response, final=final)
        try:
            refs, parameters, lease = self._outputs.write_one(request.outputs, response)
            self._device_regions.synchronize()
        except Exception as exc:  # the model answered; its outputs could not be delivered
            return StreamResponse(rid, error=error_of(exc, in_response=True), final=final)
        return StreamResponse(rid, refs, parameters, None, lease, final)
