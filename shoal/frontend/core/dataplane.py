"""The transport-agnostic core the HTTP (and later gRPC) endpoints call (docs/architecture.md §1,
MLServer's DataPlane). It holds the read-only model metadata pushed by the broker, the frontend's
input arena and the broker connection. The protocol layers parse and serialize; this does the rest.

Threads: every method runs on the frontend's asyncio event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from shoal.messages import (
    InferRequest,
    InferResponse,
    Lease,
    ModelVersionInfo,
    RepositorySnapshot,
    StatsReply,
    TensorRef,
)
from shoal.shm.arena import Slot

if TYPE_CHECKING:
    from shoal.frontend.shm_contract import SharedMemoryRegistry
    from shoal.trace.record import RequestTrace


@dataclass
class InferOutcome:
    """A successful inference: ``response.outputs`` are TensorRefs readable with
    ``DataPlane.output_view`` until ``DataPlane.release(outcome)`` is called (exactly once)."""

    response: InferResponse
    model: ModelVersionInfo


class DataPlane(Protocol):
    @property
    def snapshot(self) -> RepositorySnapshot: ...

    def is_live(self) -> bool:
        """False once shutdown began."""
        ...

    def is_exiting(self) -> bool: ...

    def is_ready(self) -> bool:
        """Live, connected to the broker, and (strict readiness) every model has a ready version."""
        ...

    def model(self, name: str, version: str | None) -> ModelVersionInfo:
        """Resolve a model for metadata/config/infer. ``version`` is the request's version
        string or None (policy: highest serving version). Raises ShoalError with Triton's codes
        and texts (``model_lookup``): a bad version string -> INVALID_ARG; a name with no
        version, no serving version, or no such version -> NOT_FOUND; a version that does not
        serve -> UNAVAILABLE."""
        ...

    def model_ready(self, name: str, version: str | None) -> bool:
        """A READY version (any, or ``version``); INVALID_ARG for a bad version string."""
        ...

    def ready_versions(self, name: str) -> list[int]: ...

    def allocate(self, nbytes: int) -> Slot:
        """A slot of the frontend arena for input bytes. Raises ShoalError(UNAVAILABLE) when the
        arena is full (backpressure). The caller owns it until passed to ``infer`` (which frees
        it) or frees it itself with ``free``."""
        ...

    def free(self, slot: Slot) -> None: ...

    async def infer(self, request: InferRequest, slots: list[Slot],
                    trace: RequestTrace | None = None) -> InferOutcome:
        """Send to the broker and wait for the terminal answer. Frees ``slots`` when the answer
        arrives (or on error). Raises ShoalError for an error answer. Cancelling the awaiting
        task cancels the request (dropped if still queued; ``is_cancelled()`` inside the model
        if running). Client shared-memory regions the request uses (``shared_memory``) stay
        registered-and-mapped until the answer arrives. A traced request's ``trace`` gets the
        answer's stamps and REQUEST_END the moment the answer arrives."""
        ...

    def infer_stream(self, request: InferRequest, slots: list[Slot],
                     trace: RequestTrace | None = None) -> AsyncIterator[InferOutcome]:
        """For decoupled models: yields every answer as the broker forwards it, in order; the
        last has ``outcome.response.final`` True (it may be ``empty``: no outputs, only the
        end). An error answer is yielded (``response.error`` set), not raised, so a stream can
        carry errors in-band. Each yielded outcome must be released. Closing the iterator or
        cancelling the consuming task before the final answer cancels the request. A traced
        request's ``trace`` gets the stamps and REQUEST_END with the final answer."""
        ...

    @property
    def shared_memory(self) -> SharedMemoryRegistry:
        """This frontend's registry of client shared-memory regions, system and CUDA (Triton's
        extensions)."""
        ...

    def output_view(self, ref: TensorRef) -> memoryview:
        """Read-only view of an output tensor's bytes (valid until release)."""
        ...

    def release(self, lease: Lease | None) -> None:
        """Give an outcome's output memory back to the worker (no round trip)."""
        ...

    async def stats(self, model: str, version: int, custom_metrics: bool = False
                    ) -> StatsReply:
        """Statistics of every model (``model`` empty) or of one (``version`` -1: its ready
        versions); a model or version with nothing ready is INVALID_ARG (Triton's texts).
        ``custom_metrics`` (with ``model`` empty): also the models' custom metrics as they are
        now, for a ``/metrics`` scrape."""
        ...

    def next_request_id(self) -> int: ...
