"""An in-test DataPlane: bytearray-backed slots, and an infer that echoes each input back as the
output of the same position in the model's config (``INPUTk`` -> ``OUTPUTk``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import orjson

from shoal.errors import ShoalError
from shoal.frontend.core import model_lookup
from shoal.frontend.core.dataplane import InferOutcome
from shoal.messages import (
    Duration,
    Error,
    InferRequest,
    InferResponse,
    Lease,
    ModelStats,
    ModelVersionInfo,
    ModelVersionState,
    Params,
    RepositorySnapshot,
    StatsReply,
    TensorRef,
    TensorSpec,
)
from shoal.shm.arena import Slot


def make_model(
    name: str = "identity",
    inputs: list[TensorSpec] | None = None,
    outputs: list[TensorSpec] | None = None,
    *,
    max_batch_size: int = 0,
    version: int = 1,
    state: ModelVersionState = ModelVersionState.READY,
    decoupled: bool = False,
    reason: str = "",
) -> ModelVersionInfo:
    inputs = inputs if inputs is not None else [TensorSpec("INPUT0", "FP32", [-1])]
    outputs = outputs if outputs is not None else [
        TensorSpec(f"OUTPUT{i}", spec.datatype, spec.dims) for i, spec in enumerate(inputs)]
    config = {"name": name, "max_batch_size": max_batch_size, "backend": "python"}
    return ModelVersionInfo(name, version, state, reason, "python", max_batch_size, inputs,
                            outputs, decoupled, orjson.dumps(config))


def _ready(info: ModelVersionInfo) -> bool:
    return info.state is ModelVersionState.READY


def zero_stats(name: str, version: int) -> ModelStats:
    zero = Duration(0, 0)
    return ModelStats(name, version, 0, 0, 0, zero, zero, zero, zero, zero, zero, [])


@dataclass
class FakeDataPlane:
    models: list[ModelVersionInfo]
    unloaded: list[str] = field(default_factory=list)
    live: bool = True
    ready: bool = True
    exiting: bool = False
    stats_models: list[ModelStats] | None = None
    stats_error: Error | None = None
    response_parameters: Params = field(default_factory=dict)
    # bookkeeping the tests look at
    requests: list[InferRequest] = field(default_factory=list)
    live_slots: dict[tuple[str, int], bytearray] = field(default_factory=dict)
    released: list[Lease | None] = field(default_factory=list)
    allocations: int = 0
    infer_error: ShoalError | None = None
    _outputs: dict[tuple[str, int], bytes] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def snapshot(self) -> RepositorySnapshot:
        return RepositorySnapshot(self.models, self.ready, self.exiting, self.unloaded)

    def is_live(self) -> bool:
        return self.live

    def is_exiting(self) -> bool:
        return self.exiting

    def is_ready(self) -> bool:
        return self.ready

    def _versions(self, name: str) -> dict[int, ModelVersionInfo]:
        return {m.version: m for m in self.models if m.name == name}

    def model(self, name: str, version: str | None) -> ModelVersionInfo:
        return model_lookup.resolve(self._versions(name), name, version, _ready)

    def model_ready(self, name: str, version: str | None) -> bool:
        return model_lookup.is_ready(self._versions(name), version, _ready)

    def ready_versions(self, name: str) -> list[int]:
        return sorted(v for v, m in self._versions(name).items()
                      if m.state is ModelVersionState.READY)

    def allocate(self, nbytes: int) -> Slot:
        self.allocations += 1
        buffer = bytearray(nbytes)
        key = ("/fake-in", self.allocations)
        self.live_slots[key] = buffer
        return Slot("/fake-in", self.allocations, nbytes, memoryview(buffer))

    def free(self, slot: Slot) -> None:
        del self.live_slots[(slot.region, slot.offset)]

    async def infer(self, request: InferRequest, slots: list[Slot]) -> InferOutcome:
        self.requests.append(request)
        contents = {ref.name: bytes(self.live_slots[(ref.region, ref.offset)])
                    for ref in request.inputs}
        for slot in slots:
            self.free(slot)
        if self.infer_error is not None:
            raise self.infer_error
        info = self.model(request.model, str(request.version))
        wanted = {o.name for o in request.outputs}
        outputs: list[TensorRef] = []
        for spec_in, spec_out in zip(info.inputs, info.outputs, strict=False):
            ref_in = next((r for r in request.inputs if r.name == spec_in.name), None)
            if ref_in is None or (wanted and spec_out.name not in wanted):
                continue
            key = ("/fake-out", len(self._outputs))
            self._outputs[key] = contents[spec_in.name]
            outputs.append(TensorRef(spec_out.name, ref_in.datatype, ref_in.shape, key[0],
                                     key[1], len(contents[spec_in.name])))
        lease = Lease("fake-worker", request.request_id)
        response = InferResponse(request.request_id, info.version, outputs,
                                 self.response_parameters, None, lease)
        return InferOutcome(response, info)

    def output_view(self, ref: TensorRef) -> memoryview:
        return memoryview(self._outputs[(ref.region, ref.offset)]).toreadonly()

    def release(self, lease: Lease | None) -> None:
        self.released.append(lease)

    async def stats(self, model: str, version: int, custom_metrics: bool = False
                    ) -> StatsReply:
        if model:
            model_lookup.check_stats_target(self.ready_versions(model), model, version)
        if self.stats_error is not None:
            return StatsReply(0, [], self.stats_error)
        if self.stats_models is not None:
            chosen = [s for s in self.stats_models
                      if (not model or s.name == model) and (version < 0 or s.version == version)]
            return StatsReply(0, chosen)
        chosen_models = [m for m in self.models if (not model or m.name == model)
                         and (version < 0 or m.version == version)]
        return StatsReply(0, [zero_stats(m.name, m.version) for m in chosen_models])

    def next_request_id(self) -> int:
        return next(self._ids)
