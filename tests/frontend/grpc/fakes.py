"""An in-test DataPlane for the gRPC service: the HTTP tests' FakeDataPlane plus per-request
delays (keyed by the client's request id), a decoupled ``infer_stream``, a recording
shared-memory registry, and a record of every request whose answer was abandoned (cancelled)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np

from shoal.errors import ErrorCode, invalid_arg
from shoal.frontend.core.dataplane import InferOutcome
from shoal.frontend.shm_contract import RegionStatus
from shoal.messages import Error, InferRequest, InferResponse, Lease, OutputTarget, TensorRef
from shoal.shm.arena import Slot
from tests.frontend.http.fakes import FakeDataPlane


@dataclass
class RecordingRegistry:
    calls: list[tuple[object, ...]] = field(default_factory=list)
    regions: list[RegionStatus] = field(default_factory=list)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.calls.append(("register", name, key, offset, byte_size))
        self.regions.append(RegionStatus(name, key, offset, byte_size))

    def unregister(self, name: str | None) -> None:
        self.calls.append(("unregister", name))
        self.regions = [r for r in self.regions if name is not None and r.name != name]

    def status(self, name: str | None) -> list[RegionStatus]:
        return [r for r in self.regions if name is None or r.name == name]

    def resolve_input(self, request_id: int, region: str, offset: int, byte_size: int,
                      tensor: str, datatype: str, shape: list[int], *,
                      model_name: str = "") -> TensorRef:
        self.calls.append(("resolve_input", region, offset, byte_size, tensor))
        raise invalid_arg(f"Unable to find shared memory region: '{region}' (used by input "
                          f"'{tensor}')")

    def resolve_output(self, request_id: int, region: str, offset: int, byte_size: int,
                       tensor: str) -> OutputTarget:
        self.calls.append(("resolve_output", region, offset, byte_size, tensor))
        return OutputTarget(region, offset, byte_size)

    def release_request(self, request_id: int) -> None:
        self.calls.append(("release_request", request_id))

    def close(self) -> None:
        pass


@dataclass
class StreamingFakeDataPlane(FakeDataPlane):
    delays: dict[str, float] = field(default_factory=dict)  # client request id -> seconds
    abandoned: list[str] = field(default_factory=list)  # client request ids
    registry: RecordingRegistry = field(default_factory=RecordingRegistry)

    @property
    def shared_memory(self) -> RecordingRegistry:
        return self.registry

    async def infer(self, request: InferRequest, slots: list[Slot]) -> InferOutcome:
        try:
            await asyncio.sleep(self.delays.get(request.client_request_id, 0.0))
        except asyncio.CancelledError:
            self.abandoned.append(request.client_request_id)
            for slot in slots:
                self.free(slot)
            raise
        return await super().infer(request, slots)

    async def infer_stream(self, request: InferRequest, slots: list[Slot]
                           ) -> AsyncIterator[InferOutcome]:
        """INPUT0 (FP32) of n elements -> one response per element, ``OUTPUT0 = [x]``, then a
        flags-only final; a negative element ends the request with an error instead."""
        ref = request.inputs[0]
        values = np.frombuffer(bytes(self.live_slots[(ref.region, ref.offset)]), np.float32)
        for slot in slots:
            self.free(slot)
        info = self.model(request.model, str(request.version))
        finished = False
        try:
            for value in values.tolist():
                await asyncio.sleep(self.delays.get(request.client_request_id, 0.0))
                if value < 0:
                    finished = True
                    error = Error(ErrorCode.INTERNAL, "negative value")
                    yield InferOutcome(InferResponse(request.request_id, error=error), info)
                    return
                key = ("/fake-out", len(self._outputs))
                self._outputs[key] = np.float32(value).tobytes()
                lease = Lease("fake-worker", request.request_id)
                response = InferResponse(request.request_id, info.version, [
                    TensorRef("OUTPUT0", "FP32", [1], key[0], key[1], 4)], lease=lease,
                    final=False)
                yield InferOutcome(response, info)
            finished = True
            yield InferOutcome(InferResponse(request.request_id, final=True, empty=True), info)
        finally:
            if not finished:
                self.abandoned.append(request.client_request_id)
