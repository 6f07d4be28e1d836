"""A ``Batch``'s requests as the backend takes them (docs/architecture.md §3 step 5, §7).

``BatchRequests`` maps each ``WorkerRequest``'s inputs where they lie, without a copy: server
segments (``RegionCache``), a client's system shared memory (``ClientRegions``), CUDA memory
(``DeviceRegions``, as a device tensor when the backend takes that input on its device) or a
small inline answer of an ensemble step; implicit-state inputs come from the sequence's state
slots (``sequence_state``). Each request becomes one ``BackendRequest``.

Contracts:
- ``build(batch)`` returns the backend requests and, per request id, the error of a request
  whose inputs cannot be mapped (it is left out of the list).
- A sequence batch (``batch.rows``) gives one request per row, in row order, each with its row
  of the control tensors; a row with no request (not ready) gets zeros shaped like the first
  mapped request, under a negative id (``-(row + 1)``), whose answer the worker drops.
- A decoupled model's requests are opened (``open_request``) as they are built: they answer
  through ``streaming.DecoupledStreams`` from then on.
- Main thread only, inside the worker's ``execute``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shoal.dtypes import numpy_to_wire
from shoal.errors import ShoalError
from shoal.messages import Batch, Error, TensorRef, WorkerRequest
from shoal.shm.client_regions import ClientRegions
from shoal.shm.regions import RegionCache
from shoal.shm.tensors import array_from_buffer
from shoal.workers.backends.base import Backend, BackendRequest
from shoal.workers.device_regions import DeviceRegions, zeros_like
from shoal.workers.sequence_state import requested_with_states, state_inputs

_NONE: frozenset[str] = frozenset()


class BatchRequests:
    def __init__(self, backend: Backend, device: str, segment_prefix: str, inputs: RegionCache,
                 client_regions: ClientRegions, device_regions: DeviceRegions,
                 open_request: Callable[[WorkerRequest], None] | None) -> None:
        """``open_request``: None unless the model is decoupled."""
        self._backend = backend
        self._device = device
        self._segment_prefix = segment_prefix
        self._inputs = inputs
        self._client_regions = client_regions
        self._device_regions = device_regions
        self._open_request = open_request

    def build(self, batch: Batch) -> tuple[list[BackendRequest], dict[int, Error]]:
        return self._sequence_requests(batch) if batch.rows else self._batch_requests(batch)

    def state_view(self, region: str, offset: int, nbytes: int) -> memoryview:
        """A writable view of a sequence's state slot (in a server segment)."""
        return self._inputs.view(region, offset, nbytes, readonly=False)

    def _map_inputs(self, req: WorkerRequest) -> dict[str, Any]:
        inputs = {ref.name: self._input_value(ref) for ref in req.inputs}
        if req.states:
            inputs.update(state_inputs(req, self.state_view))
        return inputs

    def _input_value(self, ref: TensorRef) -> Any:
        if ref.cuda is not None:
            return self._device_regions.input_value(ref, self._backend, self._device)
        if ref.inline is not None:  # an ensemble step's input from a small streamed answer
            view = memoryview(bytearray(ref.inline))
        elif ref.region.startswith(self._segment_prefix):
            view = self._inputs.view(ref.region, ref.offset, ref.nbytes, readonly=False)
        else:
            view = self._client_regions.view(ref.region, ref.offset, ref.nbytes, ref.name,
                                             object_id=ref.object_id,
                                             object_dev=ref.object_dev)
        return array_from_buffer(view, ref.datatype, ref.shape)

    def _backend_request(self, req: WorkerRequest, inputs: dict[str, Any]) -> BackendRequest:
        if self._open_request is not None:
            self._open_request(req)
        on_device = [o.name for o in req.outputs
                     if o.target is not None and o.target.cuda is not None]
        return BackendRequest(
            request_id=req.request_id, inputs=inputs,
            input_datatypes=_datatypes(req, inputs),
            requested_outputs=requested_with_states(req), parameters=req.parameters,
            client_request_id=req.client_request_id, batch_size=req.batch_size,
            correlation_id=req.correlation_id, flags=req.flags,
            device_outputs=frozenset(on_device) if on_device else _NONE)

    def _batch_requests(self, batch: Batch) -> tuple[list[BackendRequest], dict[int, Error]]:
        requests: list[BackendRequest] = []
        errors: dict[int, Error] = {}
        for req in batch.requests:
            try:
                requests.append(self._backend_request(req, self._map_inputs(req)))
            except ShoalError as exc:
                errors[req.request_id] = Error(exc.code, exc.message)
        return requests, errors

    def _sequence_requests(self, batch: Batch) -> tuple[list[BackendRequest], dict[int, Error]]:
        """One backend request per batch row, in row order, each with its row of the control
        tensors; a not-ready row gets zeros shaped like the first request (negative id)."""
        controls = {c.name: (c.datatype, array_from_buffer(memoryview(c.data), c.datatype,
                                                           c.shape)) for c in batch.controls}
        errors: dict[int, Error] = {}
        mapped: dict[int, dict[str, Any]] = {}
        for req in batch.requests:
            try:
                mapped[req.request_id] = self._map_inputs(req)
            except ShoalError as exc:
                errors[req.request_id] = Error(exc.code, exc.message)
        filler_source = next(iter(mapped.values()), {})
        requests: list[BackendRequest] = []
        for row, index in enumerate(batch.rows):
            row_controls = {name: array[row:row + 1] for name, (_, array) in controls.items()}
            if index < 0:
                filler = WorkerRequest(request_id=-(row + 1), inputs=[])
                zeros = {n: zeros_like(a) for n, a in filler_source.items()}
                requests.append(self._backend_request(filler, {**zeros, **row_controls}))
                continue
            req = batch.requests[index]
            if req.request_id in mapped:
                requests.append(self._backend_request(
                    req, {**mapped[req.request_id], **row_controls}))
        return requests, errors


def _datatypes(req: WorkerRequest, inputs: dict[str, Any]) -> dict[str, str]:
    """Input name -> wire datatype, in ``inputs``' order: the declared one, else the array's
    (state inputs)."""
    declared = {ref.name: ref.datatype for ref in req.inputs}
    if len(declared) == len(inputs) and all(declared.values()):
        return declared  # the same names in the same order: inputs maps exactly req.inputs
    return {name: declared.get(name) or numpy_to_wire(array.dtype)
            for name, array in inputs.items()}
