"""``ResponseCache``: one frontend process's response cache (Triton's ``local`` cache).

Where it sits: ``FrontendDataPlane.infer`` calls it for every request of a model whose config
has ``response_cache { enable: true }``, after the request was decoded, validated and placed,
before it would leave for the broker. HTTP, gRPC and the generate route all pass there.

- ``probe``: the request's key (``keys.request_key``) and the entry under it, if any. A request
  is not cached (``probe`` returns None) when the model is decoupled, when an input or a
  requested output lives in a client CUDA region, or when a client system region cannot be
  read.
- hit: ``answer`` builds the ``InferResponse`` from the entry (no broker, no worker). Outputs
  the request asked into a client system region are written there (``write_target``), the
  others are lent (``entries.CacheLoans``) until the DataPlane releases the answer's lease.
- miss: the request runs as usual; ``store`` copies a successful answer's outputs (from the
  worker's segment, or back from the client's region) into a new entry. An error answer, or
  one with an output in a CUDA region, is not stored; an entry larger than the cache is not
  stored (the LRU refuses it).

Figures: each hit counts its lookup + extract time, each miss its lookup + insertion time
(Triton's ``cache_hit`` / ``cache_miss``), reported to the broker (``report``) at most
``report_delay_s`` after they change and before each statistics query of this frontend.

Threads: the frontend's event loop (the LRU itself is also lock-guarded).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from shoal.errors import invalid_arg
from shoal.frontend.response_cache.entries import (
    CachedResponse,
    CacheLoans,
    build_entry,
    is_loan_region,
)
from shoal.frontend.response_cache.figures import CacheFigureBook
from shoal.frontend.response_cache.keys import InputReader, request_key
from shoal.frontend.response_cache.lru import ByteLRU
from shoal.messages import (
    CacheFigures,
    InferRequest,
    InferResponse,
    Lease,
    ModelVersionInfo,
    OutputTarget,
    TensorRef,
)

REPORT_DELAY_S: Final = 1.0

# Reads an output's bytes (a worker segment or a client system region); None if unreadable.
OutputReader = Callable[[TensorRef], "bytes | memoryview | None"]
# Writes a hit's output into the client region the request named: (request id, target, data).
TargetWriter = Callable[[int, OutputTarget, memoryview], None]


@dataclass(frozen=True, slots=True)
class CacheProbe:
    key: bytes
    lookup_ns: int
    started_ns: int
    entry: CachedResponse | None  # None: a miss


class ResponseCache:
    def __init__(self, capacity: int, report: Callable[[CacheFigures], None],
                 report_delay_s: float = REPORT_DELAY_S) -> None:
        self.entries: ByteLRU[bytes, CachedResponse] = ByteLRU(capacity)
        self.loans = CacheLoans()
        self.figures = CacheFigureBook()
        self._report = report
        self._report_delay_s = report_delay_s
        self._report_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ the request path

    def probe(self, request: InferRequest, info: ModelVersionInfo,
              read_input: InputReader) -> CacheProbe | None:
        """The request's key and cached answer; None when the request cannot be cached."""
        if not info.response_cache or info.decoupled:
            return None
        if any(o.target is not None and o.target.cuda is not None for o in request.outputs):
            return None
        started = time.perf_counter_ns()
        key = request_key(request, read_input, info.generation)
        if key is None:
            return None
        entry = self.entries.get(key)
        return CacheProbe(key, time.perf_counter_ns() - started, started, entry)

    def answer(self, request: InferRequest, info: ModelVersionInfo, probe: CacheProbe,
               write_target: TargetWriter) -> InferResponse:
        """The answer of a hit (``probe.entry`` set). Raises ShoalError INVALID_ARG when a
        client region the request named is too small (the worker's message)."""
        entry = probe.entry
        assert entry is not None, "answer() needs a hit"
        targets = {o.name: o.target for o in request.outputs if o.target is not None}
        for output in entry.outputs:
            target = targets.get(output.name)
            if target is not None and output.nbytes > target.nbytes:
                raise invalid_arg(
                    f"shared memory size specified with the request for output "
                    f"'{output.name}' ({target.nbytes} bytes) should be at least "
                    f"{output.nbytes} bytes to hold the results")
        region, lease = self.loans.lend(entry)
        refs: list[TensorRef] = []
        try:
            for output in entry.outputs:
                target = targets.get(output.name)
                if target is None:
                    refs.append(TensorRef(output.name, output.datatype, list(output.shape),
                                          region, output.offset, output.nbytes))
                    continue
                write_target(request.request_id, target, entry.data(output))
                refs.append(TensorRef(output.name, output.datatype, list(output.shape),
                                      target.region, target.offset, output.nbytes))
        except BaseException:
            self.loans.give_back(lease)
            raise
        self.figures.hit(request.model, info.version, time.perf_counter_ns() - probe.started_ns)
        self._schedule_report()
        return InferResponse(request.request_id, model_version=info.version, outputs=refs,
                             parameters=dict(entry.parameters), lease=lease)

    def store(self, request: InferRequest, info: ModelVersionInfo, probe: CacheProbe,
              response: InferResponse, read_output: OutputReader) -> None:
        """After a miss: keep a successful answer (its outputs are still lent to us)."""
        started = time.perf_counter_ns()
        if response.error is None:
            outputs: list[tuple[TensorRef, bytes | memoryview]] = []
            for ref in response.outputs:
                data = None if ref.cuda is not None else read_output(ref)
                if data is None:
                    outputs = []
                    break
                outputs.append((ref, data))
            if outputs or not response.outputs:
                entry = build_entry(outputs, response.parameters)
                self.entries.put(probe.key, entry, entry.cost)
        self.figures.miss(request.model, info.version,
                          probe.lookup_ns + time.perf_counter_ns() - started)
        self._schedule_report()

    # ------------------------------------------------------------------ lent answers

    @staticmethod
    def lends(region: str) -> bool:
        return is_loan_region(region)

    def view(self, ref: TensorRef) -> memoryview:
        return self.loans.view(ref)

    def give_back(self, lease: Lease) -> None:
        self.loans.give_back(lease)

    # ------------------------------------------------------------------ figures

    def report_now(self) -> None:
        """Send the figures gathered so far (if any)."""
        if self._report_timer is not None:
            self._report_timer.cancel()
            self._report_timer = None
        figures = self.figures.take()
        if figures is not None:
            self._report(figures)

    def _schedule_report(self) -> None:
        if self._report_timer is None:
            self._report_timer = asyncio.get_running_loop().call_later(
                self._report_delay_s, self.report_now)

    def close(self) -> None:
        if self._report_timer is not None:
            self._report_timer.cancel()
            self._report_timer = None
        self.entries.clear()
