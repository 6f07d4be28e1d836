"""``FrontendDataPlane``: the DataPlane the protocol layers call, backed by the broker connection,
the frontend's input arena and a cache of the workers' output segments.

Ownership of request memory: input slots belong to this frontend; they are freed when the broker's
terminal answer arrives (never earlier: a worker may still be reading them, even if the client
went away). Output memory belongs to a worker; it is lent through the answer's lease and returned
with ``release``.

Client shared-memory registrations live here (``shared_memory``) and are reported to the broker,
which hands them back to the frontend of the same index that replaces this one after a crash
(``start`` waits for them and for the first snapshot before the caller listens).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Final

from shoal.config.load_overrides import check_load_parameters, check_model_name
from shoal.errors import ErrorCode, ShoalError, unavailable
from shoal.frontend.broker_client import BrokerClient
from shoal.frontend.core import model_lookup
from shoal.frontend.core.dataplane import InferOutcome
from shoal.frontend.response_cache import CacheProbe, ResponseCache
from shoal.frontend.response_cache.entries import CACHE_LEASE
from shoal.messages import (
    ClientRegion,
    InferRequest,
    InferResponse,
    Lease,
    LoadModel,
    ModelVersionInfo,
    ModelVersionState,
    OutputTarget,
    RepositorySnapshot,
    StatsReply,
    TensorRef,
    UnloadModel,
)
from shoal.settings import FrontendSettings
from shoal.shm.arena import Arena, Slot
from shoal.shm.regions import RegionCache

if TYPE_CHECKING:
    from shoal.frontend.shm_contract import SharedMemoryRegistry
    from shoal.trace.record import RequestTrace

logger = logging.getLogger(__name__)

FIRST_SNAPSHOT_WAIT_S: Final = 30.0  # start serving without one after this (broker busy)


def _serving(info: ModelVersionInfo) -> bool:
    return info.serving


def _ready(info: ModelVersionInfo) -> bool:
    return info.state is ModelVersionState.READY


def frontend_identity(pid: int) -> str:
    """The broker identity of the frontend process ``pid``, also the middle of its arena's
    segment names (``<segment prefix>fe<pid>-<n>``)."""
    return f"fe{pid}"


class FrontendDataPlane:
    def __init__(self, settings: FrontendSettings, index: int = 0) -> None:
        self.settings = settings
        self.index = index
        frontend_id = frontend_identity(os.getpid())
        self.arena = Arena(f"{settings.instance.segment_prefix}{frontend_id}-",
                           settings.shm.segment_bytes,
                           settings.shm.arena_max_bytes)
        self.outputs = RegionCache(settings.instance.segment_prefix)
        self.client = BrokerClient(f"ipc://{settings.instance.runtime_dir}/frontend.sock",
                                   frontend_id,
                                   self._on_snapshot, index, self._restore_region)
        self._snapshot = RepositorySnapshot(models=[], models_ready=False)
        self._connected = False
        self._models: dict[str, dict[int, ModelVersionInfo]] = {}
        self._exiting = False
        self._ids = itertools.count(1)
        self.drained = asyncio.Event()
        self._first_snapshot = asyncio.Event()
        self._shared_memory: SharedMemoryRegistry | None = None
        # --cache-config: this frontend's share of the response cache (each frontend process
        # holds its own LRU; their figures are summed by the broker)
        cache_bytes = settings.response_cache_bytes // max(1, settings.http.workers)
        self.response_cache = ResponseCache(
            cache_bytes, self.client.report_cache_figures) if cache_bytes > 0 else None
        self._cache_off_noted: set[str] = set()

    @property
    def shared_memory(self) -> SharedMemoryRegistry:
        if self._shared_memory is None:  # built on first use
            from shoal.frontend.shm_registry import ClientSharedMemoryRegistry

            self._shared_memory = ClientSharedMemoryRegistry(
                self.settings, on_cuda_forget=self.client.forget_cuda_handles,
                on_registered=self.client.region_registered,
                on_unregistered=self.client.region_unregistered)
        return self._shared_memory

    async def start(self, first_snapshot_wait_s: float = FIRST_SNAPSHOT_WAIT_S) -> None:
        """Connect; return once the broker's first snapshot arrived (the client regions kept
        for this index come before it), or after ``first_snapshot_wait_s``."""
        await self.client.start()
        try:
            await asyncio.wait_for(self._first_snapshot.wait(), first_snapshot_wait_s)
        except TimeoutError:
            logger.warning("no repository snapshot from the broker after %.0f s; serving "
                           "without one", first_snapshot_wait_s)

    def _restore_region(self, region: ClientRegion) -> None:
        """A registration of this index that outlived its frontend (see ``start``)."""
        try:
            self.shared_memory.restore(region)
        except ShoalError as exc:
            logger.warning("shared memory region %r of the previous frontend %d cannot be "
                           "taken over: %s", region.name, self.index, exc.message)
            self.client.region_unregistered(region.name)

    async def close(self) -> None:
        if self._shared_memory is not None:  # first: its CUDA forgets go through the client
            self._shared_memory.close()
        if self.response_cache is not None:
            self.response_cache.close()
        await self.client.close()
        self.outputs.close()
        self.arena.close()

    def _on_snapshot(self, snapshot: RepositorySnapshot) -> None:
        self._snapshot = snapshot
        self._connected = True
        models: dict[str, dict[int, ModelVersionInfo]] = {name: {} for name in snapshot.unloaded}
        for info in snapshot.models:
            models.setdefault(info.name, {})[info.version] = info
        self._models = models
        self._first_snapshot.set()
        if self.response_cache is None and self.index == 0:
            self._note_cache_off(snapshot)

    def _note_cache_off(self, snapshot: RepositorySnapshot) -> None:
        """Once per model: its config enables the response cache but the server has none
        (as Triton, it serves uncached)."""
        for info in snapshot.models:
            if info.response_cache and info.name not in self._cache_off_noted:
                self._cache_off_noted.add(info.name)
                logger.warning("model '%s' enables response_cache but the server has no cache "
                               "(--cache-config local,size=N): its responses are not cached",
                               info.name)

    # ---------------------------------------------------------------- state

    @property
    def snapshot(self) -> RepositorySnapshot:
        return self._snapshot

    def begin_exit(self) -> None:
        self._exiting = True
        self._check_drained()

    def _check_drained(self) -> None:
        if self._exiting and self.client.in_flight == 0:
            self.drained.set()

    def is_live(self) -> bool:
        """False once the server is stopping or the broker has exited (the supervisor then
        stops the server: a health check must not see a server that can answer nothing)."""
        return not self._exiting and not self.client.broker_gone

    def is_exiting(self) -> bool:
        return self._exiting

    def is_ready(self) -> bool:
        if self._exiting or not self._connected or self._snapshot.exiting \
                or self.client.broker_gone:
            return False
        return self._snapshot.models_ready or not self.settings.model_control.strict_readiness

    def model(self, name: str, version: str | None) -> ModelVersionInfo:
        return model_lookup.resolve(self._models.get(name), name, version, _serving)

    def model_ready(self, name: str, version: str | None) -> bool:
        return model_lookup.is_ready(self._models.get(name), version, _ready)

    def ready_versions(self, name: str) -> list[int]:
        return sorted(v for v, i in self._models.get(name, {}).items()
                      if i.state is ModelVersionState.READY)

    # ---------------------------------------------------------------- data path

    def next_request_id(self) -> int:
        return next(self._ids)

    def allocate(self, nbytes: int) -> Slot:
        return self.arena.allocate(nbytes)

    def free(self, slot: Slot) -> None:
        self.arena.free(slot)

    async def infer(self, request: InferRequest, slots: list[Slot],
                    trace: RequestTrace | None = None) -> InferOutcome:
        info = self._admit(request, slots)
        cache = self.response_cache
        probe = None if cache is None else cache.probe(
            request, info, lambda ref: self._input_bytes(ref, request.request_id, slots))
        if probe is not None and probe.entry is not None:
            return self._answer_from_cache(request, slots, info, probe, trace)
        future = self.client.submit(request)
        future.add_done_callback(lambda f: self._end_request(request.request_id, slots))
        if trace is not None:
            future.add_done_callback(trace.answered_future)
        try:
            response = await asyncio.shield(future)
        except asyncio.CancelledError:
            # The client went away: drop the request if still queued; memory is freed when the
            # terminal answer arrives (the worker may be reading the inputs right now).
            if not future.done():
                self.client.cancel(request.request_id)
                future.add_done_callback(self._release_abandoned)
            raise
        if probe is not None and cache is not None:
            cache.store(request, info, probe, response,
                        lambda ref: self._output_bytes(ref, request.request_id))
        if response.error is not None:
            raise ShoalError(response.error.code, response.error.message)
        return InferOutcome(response, info)

    # ---------------------------------------------------------------- response cache

    def _answer_from_cache(self, request: InferRequest, slots: list[Slot],
                           info: ModelVersionInfo, probe: CacheProbe,
                           trace: RequestTrace | None) -> InferOutcome:
        """A hit: answered here, the request never leaves this process."""
        assert self.response_cache is not None
        try:
            response = self.response_cache.answer(request, info, probe, self._write_target)
        finally:
            self._end_request(request.request_id, slots)
        if trace is not None:
            trace.answered(response)
        return InferOutcome(response, info)

    def _input_bytes(self, ref: TensorRef, request_id: int,
                     slots: list[Slot]) -> bytes | memoryview | None:
        """An input's bytes for the cache key: its arena slot, or a copy from a client system
        region; None for a CUDA region."""
        if ref.cuda is not None:
            return None
        for slot in slots:
            if slot.region == ref.region and slot.offset == ref.offset:
                return slot.view[:ref.nbytes]
        if self._shared_memory is None:
            return None
        return self._shared_memory.read_system(request_id, ref.region, ref.offset, ref.nbytes)

    def _output_bytes(self, ref: TensorRef, request_id: int) -> bytes | memoryview | None:
        """An answer's output bytes to keep in the cache: from the worker's segment, or back
        from the client system region it was written to."""
        if ref.inline is not None or ref.region.startswith(self.settings.instance.segment_prefix):
            return self.output_view(ref)
        if self._shared_memory is None:
            return None
        return self._shared_memory.read_system(request_id, ref.region, ref.offset, ref.nbytes)

    def _write_target(self, request_id: int, target: OutputTarget, data: memoryview) -> None:
        self.shared_memory.write_system(request_id, target.region, target.offset, data)

    def _admit(self, request: InferRequest, slots: list[Slot]) -> ModelVersionInfo:
        try:
            if self._exiting:
                raise unavailable("Server exiting")
            version = request.version  # resolved by the caller (a negative one is refused)
            number = version if version >= 0 else model_lookup.parse_version(str(version))
            return model_lookup.resolve_number(self._models.get(request.model), request.model,
                                               number, _serving)
        except ShoalError:
            self._end_request(request.request_id, slots)
            raise

    def _end_request(self, request_id: int, slots: list[Slot]) -> None:
        """The request's terminal answer arrived (or it never left): its input memory and any
        client regions it used are free again."""
        for slot in slots:
            self.arena.free(slot)
        if self._shared_memory is not None:
            self._shared_memory.release_request(request_id)
        self._check_drained()

    async def infer_stream(self, request: InferRequest, slots: list[Slot],
                           trace: RequestTrace | None = None) -> AsyncIterator[InferOutcome]:
        info = self._admit(request, slots)
        queue = self.client.submit_stream(
            request, lambda: self._end_request(request.request_id, slots))
        finished = False
        try:
            while not finished:
                response = await queue.get()
                finished = response.final
                if finished and trace is not None:
                    trace.answered(response)
                yield InferOutcome(response, info)
        finally:
            if not finished:  # consumer left early: stop the model, drop what still comes
                self.client.abandon_stream(request.request_id)
                self.client.cancel(request.request_id)

    def _release_abandoned(self, future: asyncio.Future[InferResponse]) -> None:
        if not future.cancelled() and future.exception() is None:
            self.release(future.result().lease)

    def output_view(self, ref: TensorRef) -> memoryview:
        if ref.inline is not None:  # a small streamed response's bytes, in the message
            return memoryview(ref.inline)
        cache = self.response_cache
        if cache is not None and cache.lends(ref.region):
            return cache.view(ref)
        return self.outputs.view(ref.region, ref.offset, ref.nbytes)

    def release(self, lease: Lease | None) -> None:
        if lease is None:
            return
        if self.response_cache is not None and lease.instance == CACHE_LEASE:
            self.response_cache.give_back(lease)
            return
        self.client.release(lease)

    # ---------------------------------------------------------------- model control (explicit)

    async def load_model(self, name: str, parameters: Mapping[str, str | bytes]) -> None:
        """ModelControl: check the name and overrides here (400 before anything reaches the
        broker or a disk), then wait for the broker's load to finish."""
        overrides = check_load_parameters(name, parameters)
        reply = await self.client.control(lambda query: LoadModel(
            query, name, overrides.config_json,
            {f"file:{path}": data for path, data in overrides.files.items()}))
        if reply.error is not None:
            raise ShoalError(reply.error.code, reply.error.message)

    async def unload_model(self, name: str, unload_dependents: bool) -> None:
        check_model_name(name)
        reply = await self.client.control(lambda query: UnloadModel(query, name,
                                                                    unload_dependents))
        if reply.error is not None:
            raise ShoalError(reply.error.code, reply.error.message)

    async def stats(self, model: str, version: int, custom_metrics: bool = False
                    ) -> StatsReply:
        if model:
            model_lookup.check_stats_target(self.ready_versions(model), model, version)
        if self.response_cache is not None:
            self.response_cache.report_now()  # this frontend's figures reach the broker first
        try:
            return await self.client.stats(model, version, custom_metrics=custom_metrics)
        except TimeoutError as exc:
            raise ShoalError(ErrorCode.UNAVAILABLE, "statistics are not available") from exc
