"""Writing backend outputs: into the worker's output arena (one lease per batch or per streamed
response) or straight into a client's shared-memory region (system or CUDA) when the request
named one.

Contract: every arena-backed output of one write call lives in one arena slot, the call's lease;
the frontend releases each response's lease once, and the slot is freed when every response that
got the lease has released it (reference count = responses with arena outputs). Outputs written
into a client region need no lease. A streamed response (``write_one``) whose outputs all go to
the arena and take at most ``INLINE_MAX_BYTES`` carries their bytes inline in its TensorRefs
instead: no slot, no lease, no release round trip (an LLM stream sends one such response per
token). An arena output of no bytes (a tensor with a 0 dim, a BYTES tensor of no elements) is
always such an inline TensorRef (``inline=b""``): it takes no slot and holds no lease.
Callers serialize calls (the worker holds its output lock).
An output may be a torch tensor (any device): it goes tensor to tensor into a CUDA region, and
to the host first anywhere else. Copies into CUDA regions may still run when a call returns: the
caller synchronizes (``DeviceRegions.synchronize``) before it answers.

Lent slots (``output_lending.OutputLender``): an output the backend wrote into a slot lent to it
before the run is referenced in place (no copy), and the lent slots an answer references belong
to that call's lease as well.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shoal.dtypes import FIXED_NUMPY, element_size, is_datatype
from shoal.errors import ErrorCode, ShoalError, invalid_arg
from shoal.messages import Error, Lease, OutputTarget, RequestedOutput, Result, TensorRef
from shoal.shm.arena import Arena, Slot, never_fits
from shoal.shm.client_regions import ClientRegions
from shoal.shm.tensors import array_to_bytes, wire_nbytes, write_array
from shoal.workers.backends.base import BackendResponse, OutputTensor
from shoal.workers.device_regions import DeviceRegions, host_array, is_torch_tensor
from shoal.workers.output_lending import OutputLender

_ALIGN = 64
INLINE_MAX_BYTES = 512  # a streamed response this small (arena bytes, aligned) rides inline


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass
class _LeaseEntry:
    slot: Slot | None  # None when every arena output of the call was written in a lent slot
    remaining: int
    lent: list[Slot] = field(default_factory=list)  # lent slots the call's answers reference


@dataclass(slots=True)
class _Placed:
    """One response's selected outputs with their sizes and client targets."""

    tensors: list[OutputTensor]
    sizes: list[int]
    targets: list[OutputTarget | None]
    parameters: dict[str, str | int | float | bool]
    in_place: list[tuple[Slot, int] | None]  # (lent slot, offset) of outputs written there
    arena_bytes: int  # bytes to copy into the call's own slot (aligned sizes)
    holds_lease: bool  # it has arena outputs or references a lent slot

    @property
    def fits_inline(self) -> bool:
        """Every output goes to the arena (no client target, none lent) and they are small."""
        return (0 < self.arena_bytes <= INLINE_MAX_BYTES
                and all(t is None for t in self.targets)
                and all(lent is None for lent in self.in_place))


class OutputWriter:
    def __init__(self, instance: str, arena: Arena, client: ClientRegions,
                 device: DeviceRegions, lender: OutputLender | None = None) -> None:
        self._instance = instance
        self._arena = arena
        self._lender = lender
        self._client = client
        self._device = device
        self._leases: dict[int, _LeaseEntry] = {}
        self._next_id = 1

    def __len__(self) -> int:
        return len(self._leases)

    def release(self, lease_id: int) -> None:
        entry = self._leases.get(lease_id)
        if entry is None:
            return
        entry.remaining -= 1
        if entry.remaining <= 0:
            del self._leases[lease_id]
            if entry.slot is not None:
                self._arena.free(entry.slot)
            for slot in entry.lent:
                self._arena.free(slot)

    def write_results(
        self,
        request_ids: list[int],
        requested: list[list[RequestedOutput]],
        responses: list[BackendResponse | Error],
    ) -> tuple[list[Result], Lease | None]:
        """Copy a batch's responses out; returns one Result per request and the shared lease.
        A response whose outputs alone could never fit the arena gets its own INVALID_ARG
        error and the rest are written; responses that each fit but together cannot is a
        batch-wide UNAVAILABLE (the batch was too large, not any request)."""
        try:
            return self._write_batch(request_ids, requested, responses)
        except ShoalError as exc:
            if exc.code is not ErrorCode.INVALID_ARG or len(responses) < 2:
                raise
            screened = [self._never_fitting(response, wanted)
                        for response, wanted in zip(responses, requested, strict=True)]
            if all(s is r for s, r in zip(screened, responses, strict=True)):
                raise ShoalError(ErrorCode.UNAVAILABLE,
                                 f"the outputs of a batch of {len(responses)} requests do not "
                                 f"fit in shared memory together ({exc.message})") from exc
            return self.write_results(request_ids, requested, screened)

    def _never_fitting(self, response: BackendResponse | Error, wanted: list[RequestedOutput]
                       ) -> BackendResponse | Error:
        """``response``, or the error of its outputs alone being larger than the arena."""
        if isinstance(response, Error):
            return response
        placed = self._place(response, wanted)
        if isinstance(placed, _Placed) and placed.arena_bytes > self._arena.max_bytes:
            return error_of(never_fits(placed.arena_bytes, self._arena.max_bytes),
                            in_response=True)
        return response

    def _write_batch(
        self,
        request_ids: list[int],
        requested: list[list[RequestedOutput]],
        responses: list[BackendResponse | Error],
    ) -> tuple[list[Result], Lease | None]:
        plain = self._write_plain(request_ids, requested, responses)
        if plain is not None:
            return plain
        placed = [self._place(resp, req) if isinstance(resp, BackendResponse) else resp
                  for resp, req in zip(responses, requested, strict=True)]
        holders = [p for p in placed if isinstance(p, _Placed) and p.holds_lease]
        slot, lease = self._lease(sum(p.arena_bytes for p in holders), len(holders),
                                  [lent[0] for p in holders for lent in p.in_place if lent])
        results: list[Result] = []
        position = 0
        for request_id, entry in zip(request_ids, placed, strict=True):
            if isinstance(entry, Error):
                results.append(Result(request_id, error=entry))
                continue
            try:
                refs, position = self._write(entry, slot, position)
            except ShoalError as exc:  # the model answered: the error is its response's
                if lease is not None and entry.holds_lease:
                    self.release(lease.lease_id)  # this response will not hold the lease
                results.append(Result(request_id, error=error_of(exc, in_response=True)))
                continue
            results.append(Result(request_id, outputs=refs, parameters=entry.parameters))
        return results, lease

    def _write_plain(
        self,
        request_ids: list[int],
        requested: list[list[RequestedOutput]],
        responses: list[BackendResponse | Error],
    ) -> tuple[list[Result], Lease | None] | None:
        """``write_results`` of the common batch, in one pass with no per-response _Placed:
        every selected output is a non-empty C-contiguous ndarray already of its datatype's
        dtype, bound for this arena (no client target, nothing lent). The same Results, lease
        and slot layout as the general path. None, having done nothing, for any other batch."""
        if self._lender is not None and self._lender.has_lent:
            return None
        plans: list[list[OutputTensor] | Error] = []
        total = holders = 0
        for response, wanted in zip(responses, requested, strict=True):
            if isinstance(response, Error):
                plans.append(response)
                continue
            if any(r.target is not None for r in wanted):
                return None
            tensors = _select_outputs(response, wanted)
            for tensor in tensors:
                array = tensor.array
                fixed = FIXED_NUMPY.get(tensor.datatype)  # None != float64 is False in numpy
                if (fixed is None or type(array) is not np.ndarray or not array.size
                        or not array.flags.c_contiguous or array.dtype != fixed):
                    return None
                total += _align(array.nbytes)
            holders += 1 if tensors else 0
            plans.append(tensors)
        slot, lease = self._lease(total, holders, [])
        results: list[Result] = []
        position = 0
        for request_id, plan, response in zip(request_ids, plans, responses, strict=True):
            if isinstance(plan, Error):
                results.append(Result(request_id, error=plan))
                continue
            refs: list[TensorRef] = []
            for tensor in plan:
                assert slot is not None
                array = tensor.array
                nbytes = array.nbytes
                slot.view[position:position + nbytes] = array.data.cast("B")
                refs.append(TensorRef(tensor.name, tensor.datatype, list(array.shape),
                                      slot.region, slot.offset + position, nbytes))
                position += _align(nbytes)
            assert isinstance(response, BackendResponse)
            results.append(Result(request_id, outputs=refs,
                                  parameters=dict(response.parameters)))
        return results, lease

    def write_one(self, requested: list[RequestedOutput], response: BackendResponse
                  ) -> tuple[list[TensorRef], dict[str, str | int | float | bool], Lease | None]:
        """One streamed response; raises ShoalError (nothing kept) when it cannot be written."""
        placed = self._place(response, requested)
        if isinstance(placed, Error):
            raise ShoalError(placed.code, placed.message)
        if placed.fits_inline:
            return _inline(placed), placed.parameters, None
        slot, lease = self._lease(placed.arena_bytes, 1 if placed.holds_lease else 0,
                                  [lent[0] for lent in placed.in_place if lent])
        try:
            refs, _ = self._write(placed, slot, 0)
        except ShoalError:
            if lease is not None:
                self.release(lease.lease_id)
            raise
        return refs, placed.parameters, lease

    def _lease(self, nbytes: int, holders: int, lent: list[Slot]
               ) -> tuple[Slot | None, Lease | None]:
        if not holders:
            return None, None
        slot = self._arena.allocate(nbytes) if nbytes else None
        unique = list({id(s): s for s in lent}.values())
        for lent_slot in unique:
            assert self._lender is not None
            self._lender.claim(lent_slot)
        lease_id = self._next_id
        self._next_id += 1
        self._leases[lease_id] = _LeaseEntry(slot, holders, unique)
        return slot, Lease(self._instance, lease_id)

    def _place(self, response: BackendResponse, requested: list[RequestedOutput]
               ) -> _Placed | Error:
        tensors = _select_outputs(response, requested)
        lender = self._lender
        if not any(r.target is not None for r in requested) and (
                lender is None or not lender.has_lent):  # the common case: all to the arena
            tensors = [_for_target(t, None) for t in tensors]
            sizes = [_output_nbytes(t.array, t.datatype) for t in tensors]
            arena_bytes = sum(_align(n) for n in sizes)
            return _Placed(tensors, sizes, [None] * len(tensors), dict(response.parameters),
                           [None] * len(tensors), arena_bytes, arena_bytes > 0)
        by_name = {r.name: r.target for r in requested}
        targets = [by_name.get(t.name) for t in tensors]
        tensors = [_for_target(t, target) for t, target in zip(tensors, targets, strict=True)]
        sizes = [_output_nbytes(t.array, t.datatype) for t in tensors]
        in_place = [lender.locate(t.array, n) if lender is not None and target is None else None
                    for t, n, target in zip(tensors, sizes, targets, strict=True)]
        for tensor, size, target in zip(tensors, sizes, targets, strict=True):
            if target is not None and size > target.nbytes:  # the response's error
                return Error(ErrorCode.INVALID_ARG,
                             f"shared memory size specified with the request for output "
                             f"'{tensor.name}' ({target.nbytes} bytes) should be at least "
                             f"{size} bytes to hold the results", in_response=True)
        arena_bytes = sum(_align(n) for n, t, lent in zip(sizes, targets, in_place, strict=True)
                          if t is None and lent is None)
        return _Placed(tensors, sizes, targets, dict(response.parameters), in_place, arena_bytes,
                       arena_bytes > 0 or any(lent is not None for lent in in_place))

    def _write(self, placed: _Placed, slot: Slot | None, position: int
               ) -> tuple[list[TensorRef], int]:
        refs: list[TensorRef] = []
        for tensor, nbytes, target, lent in zip(placed.tensors, placed.sizes, placed.targets,
                                                placed.in_place, strict=True):
            shape = list(tensor.array.shape)  # ints (numpy and torch shapes hold ints)
            if lent is not None:  # the backend wrote it into a lent slot: no copy
                lent_slot, offset = lent
                refs.append(TensorRef(tensor.name, tensor.datatype, shape, lent_slot.region,
                                      lent_slot.offset + offset, nbytes))
                continue
            if target is not None and target.cuda is not None:
                written = self._device.write_output(target, tensor.array, tensor.datatype,
                                                    tensor.name)
                refs.append(TensorRef(tensor.name, tensor.datatype, shape, "", target.offset,
                                      written, cuda=target.cuda))
                continue
            if target is not None:
                view = self._client.view(target.region, target.offset, nbytes, tensor.name,
                                         writable=True, object_id=target.object_id,
                                         object_dev=target.object_dev)
                write_array(view, tensor.array, tensor.datatype)
                refs.append(TensorRef(tensor.name, tensor.datatype, shape, target.region,
                                      target.offset, nbytes, object_id=target.object_id,
                                      object_dev=target.object_dev))
                continue
            if not nbytes:  # a tensor of no elements: no bytes to place, none to lease
                refs.append(TensorRef(tensor.name, tensor.datatype, shape, "", 0, 0,
                                      inline=b""))
                continue
            if slot is None:  # _place counted this output's bytes: the call's slot holds them
                raise ShoalError(ErrorCode.INTERNAL, "no output slot for output "
                                 f"'{tensor.name}' ({nbytes} bytes)")
            write_array(slot.view[position:position + nbytes], tensor.array, tensor.datatype)
            refs.append(TensorRef(tensor.name, tensor.datatype, shape, slot.region,
                                  slot.offset + position, nbytes))
            position += _align(nbytes)
        return refs, position


def _inline(placed: _Placed) -> list[TensorRef]:
    """The outputs of a small streamed response as TensorRefs carrying their bytes."""
    refs: list[TensorRef] = []
    for tensor, nbytes in zip(placed.tensors, placed.sizes, strict=True):
        data = array_to_bytes(tensor.array, tensor.datatype)
        refs.append(TensorRef(tensor.name, tensor.datatype, [int(d) for d in tensor.array.shape],
                              "", 0, nbytes, inline=data))
    return refs


def _select_outputs(
    response: BackendResponse, requested: list[RequestedOutput]
) -> list[OutputTensor]:
    """The response's outputs the request asked for, in the request's order (all of them, in
    the model's order, when it named none). An output the model did not produce is left out,
    as Triton does: the answer holds what the model produced of what was asked (possibly
    nothing), never an error."""
    if not requested:
        return list(response.outputs)
    by_name = {t.name: t for t in response.outputs}
    return [by_name[out.name] for out in requested if out.name in by_name]


def _for_target(tensor: OutputTensor, target: OutputTarget | None) -> OutputTensor:
    """``tensor`` as it is written to ``target``: a torch tensor stays one only for a CUDA
    region (tensor-to-tensor copy); elsewhere it becomes a host array."""
    if type(tensor.array) is np.ndarray or not is_torch_tensor(tensor.array):
        return tensor
    if target is not None and target.cuda is not None and tensor.datatype != "BYTES":
        return tensor
    return OutputTensor(tensor.name, tensor.datatype, host_array(tensor.array))


def _output_nbytes(array: Any, datatype: str) -> int:
    if type(array) is np.ndarray or not is_torch_tensor(array):
        return wire_nbytes(array, datatype)
    if not is_datatype(datatype) or datatype == "BYTES":
        raise invalid_arg(f"unknown datatype '{datatype}'")
    return int(array.numel()) * element_size(datatype)


def error_of(exc: BaseException, in_response: bool = False) -> Error:
    """``exc`` as an Error; ``in_response``: the model answered and this is why its outputs
    could not be delivered (``Error.in_response``)."""
    if isinstance(exc, ShoalError):
        return Error(exc.code, exc.message, in_response)
    return Error(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}", in_response)


__all__ = ["OutputWriter", "error_of", "invalid_arg"]
