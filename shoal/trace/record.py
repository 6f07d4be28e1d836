"""One sampled request's trace as the frontend builds it: its id and model, Triton's timestamps
in the order they happen, and (level TENSORS) copies of its input and output tensors.

Stamps are ``time.monotonic_ns`` (CLOCK_MONOTONIC), the clock the broker and the workers stamp
with too. The frontend stamps the protocol ends (HTTP_* / GRPC_*), REQUEST_START when the request
leaves for the broker and REQUEST_END when its terminal answer arrives; ``answered`` adds the
broker's and worker's stamps (``messages.TraceStamps``) just before REQUEST_END.

Threads: built and stamped on the frontend's event loop; once handed to the tracer
(``Tracer.finish``) it is read-only and the writer thread formats it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from shoal.errors import ShoalError
from shoal.messages import InferResponse, TensorRef


class TracedInput(Protocol):
    """What a trace copies of a decoded input (the frontend's ``DecodedInput``); ``shm`` is
    set (not None) for an input in client shared memory, whose bytes are not copied."""

    @property
    def name(self) -> str: ...
    @property
    def datatype(self) -> str: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def data(self) -> memoryview: ...
    @property
    def shm(self) -> object | None: ...

HTTP_RECV_START: Final = "HTTP_RECV_START"
HTTP_RECV_END: Final = "HTTP_RECV_END"
HTTP_SEND_START: Final = "HTTP_SEND_START"
HTTP_SEND_END: Final = "HTTP_SEND_END"
GRPC_WAITREAD_START: Final = "GRPC_WAITREAD_START"
GRPC_WAITREAD_END: Final = "GRPC_WAITREAD_END"
GRPC_SEND_START: Final = "GRPC_SEND_START"
GRPC_SEND_END: Final = "GRPC_SEND_END"
REQUEST_START: Final = "REQUEST_START"
QUEUE_START: Final = "QUEUE_START"
COMPUTE_START: Final = "COMPUTE_START"
COMPUTE_INPUT_END: Final = "COMPUTE_INPUT_END"
COMPUTE_OUTPUT_START: Final = "COMPUTE_OUTPUT_START"
COMPUTE_END: Final = "COMPUTE_END"
REQUEST_END: Final = "REQUEST_END"
BROKER_STAMPS: Final = (QUEUE_START, COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START,
                        COMPUTE_END)
TENSOR_QUEUE_INPUT: Final = "TENSOR_QUEUE_INPUT"
TENSOR_BACKEND_OUTPUT: Final = "TENSOR_BACKEND_OUTPUT"
SERVER_SEGMENTS: Final = "/shoal-"  # worker arenas; client regions never start so


@dataclass(frozen=True, slots=True)
class TensorCopy:
    """A tensor's bytes as they were (little-endian, row-major; BYTES with 4-byte lengths)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes


class RequestTrace:
    """``scope``: the sampling scope that took it (an opaque handle of ``sampling``);
    ``tensors``: copy the tensors (level TENSORS, triton mode). ``done``: handed to the
    tracer."""

    __slots__ = ("done", "inputs", "model_name", "model_version", "outputs", "request_id",
                 "scope", "stamps", "tensors", "timestamps", "trace_id")

    def __init__(self, trace_id: int, model_name: str, scope: object, tensors: bool) -> None:
        self.trace_id = trace_id
        self.model_name = model_name
        self.model_version = -1  # until the model is resolved
        self.request_id = ""
        self.scope = scope
        self.tensors = tensors
        self.timestamps = True  # level TIMESTAMPS: the stamps are written too
        self.stamps: list[tuple[str, int]] = []
        self.inputs: list[TensorCopy] = []
        self.outputs: list[TensorCopy] = []
        self.done = False

    def stamp(self, name: str) -> None:
        self.stamps.append((name, time.monotonic_ns()))

    def request_started(self, model_version: int, request_id: str,
                        inputs: Sequence[TracedInput]) -> None:
        """REQUEST_START: the request leaves for the broker. With ``tensors``, the inputs
        that travel as bytes are copied (those in client shared memory are not)."""
        self.model_version, self.request_id = model_version, request_id
        if self.tensors:
            self.inputs = [TensorCopy(t.name, t.datatype, tuple(t.shape), bytes(t.data))
                           for t in inputs if t.shm is None]
        self.stamp(REQUEST_START)

    def answered(self, response: InferResponse) -> None:
        """The terminal answer arrived: the broker's stamps, then REQUEST_END."""
        stamps = response.trace
        if stamps is not None:
            for name, ns in zip(BROKER_STAMPS, (
                    stamps.queue_start, stamps.compute_start, stamps.compute_input_end,
                    stamps.compute_output_start, stamps.compute_end), strict=True):
                if ns:
                    self.stamps.append((name, ns))
        self.stamp(REQUEST_END)

    def answered_future(self, future: asyncio.Future[InferResponse]) -> None:
        """``answered`` as a done-callback of the answer's future (stamped the moment it
        resolves); a cancelled or failed future only ends the request."""
        if future.cancelled() or future.exception() is not None:
            self.stamp(REQUEST_END)
        else:
            self.answered(future.result())

    def capture_outputs(self, refs: Sequence[TensorRef],
                        view: Callable[[TensorRef], memoryview]) -> None:
        """With ``tensors``: copy the answer's outputs (before their memory is released);
        outputs the server cannot read back (a client's CUDA or shared-memory region) are
        left out."""
        if not self.tensors:
            return
        for ref in refs:
            if ref.cuda is None and (ref.inline is not None
                                     or ref.region.startswith(SERVER_SEGMENTS)):
                try:
                    data = bytes(view(ref))
                except ShoalError:
                    continue
                self.outputs.append(TensorCopy(ref.name, ref.datatype, tuple(ref.shape), data))


def stamp_of(trace: RequestTrace, name: str) -> int:
    """The first stamp named ``name`` (0 if absent)."""
    return next((ns for n, ns in trace.stamps if n == name), 0)
