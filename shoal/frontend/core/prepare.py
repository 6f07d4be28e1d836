"""The transport-neutral half of serving one inference: a decoded, validated request (``http/codec``
``DecodedRequest`` + ``http/validation`` ``InferPlan``, whatever protocol it came from) becomes an
``InferRequest`` whose inputs live in shared memory.

Ownership: ``prepare_request`` returns the input slots it allocated; the caller hands them to
``DataPlane.infer`` / ``infer_stream`` (which frees them). When anything fails before that,
``prepare_request`` frees them itself and ends the request's client-shm use
(``SharedMemoryRegistry.release_request``), so a failed preparation leaves nothing behind.

Threads: the frontend's event loop (as every DataPlane call).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar

from shoal.frontend.core.validation import RequestCheckError, tagged
from shoal.messages import InferRequest, ModelVersionInfo, RequestedOutput, TensorRef

_Item = TypeVar("_Item")
IN_PLACE_ALIGNMENT: Final = 64  # an input referenced inside a body slot starts this aligned

if TYPE_CHECKING:
    from shoal.frontend.core.dataplane import DataPlane
    from shoal.frontend.core.decoded import DecodedRequest
    from shoal.frontend.core.validation import InferPlan
    from shoal.shm.arena import Slot
    from shoal.trace.record import RequestTrace


@dataclass(frozen=True, slots=True)
class BodySlot:
    """An HTTP body read straight into an arena slot: body byte ``i`` is at
    ``slot.view[start + i]``. Binary inputs that start 64-byte aligned in the slot are referenced
    in place (no copy); ``start`` pads the body so the binary part begins aligned."""

    slot: Slot
    start: int


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    request: InferRequest
    slots: list[Slot]  # owned by the caller until passed to the DataPlane


def prepare_request(
    dataplane: DataPlane,
    decoded: DecodedRequest,
    plan: InferPlan,
    model: ModelVersionInfo,
    trace: RequestTrace | None = None,
    body: BodySlot | None = None,
) -> PreparedRequest:
    """Place the inputs (one arena slot each, or a reference into a client region for an input
    with ``shm``) and build the InferRequest (outputs with ``shm`` get the region as target).
    Raises ShoalError (arena full: UNAVAILABLE; bad region reference: from the registry) after
    undoing everything it did. A ``trace`` marks the request traced and is stamped
    REQUEST_START (the request is ready to leave). ``body``: the request body lies in this
    slot (the caller's until now; from the call on it is one of the request's slots)."""
    request_id = dataplane.next_request_id()
    slots: list[Slot] = [] if body is None else [body.slot]
    try:
        refs = _place_inputs(dataplane, decoded, model.name, request_id, slots, body)
        outputs = _requested_outputs(dataplane, plan, request_id)
    except BaseException:
        for slot in slots:
            dataplane.free(slot)
        if any(t.shm is not None for t in decoded.inputs) or any(
                o.shm is not None for o in plan.outputs):
            dataplane.shared_memory.release_request(request_id)
        raise
    request = InferRequest(
        request_id=request_id,
        model=model.name,
        version=model.version,
        inputs=refs,
        outputs=outputs,
        parameters=decoded.parameters,
        client_request_id=decoded.client_id,
        batch_size=plan.batch_size,
        priority=decoded.priority,
        timeout_us=decoded.timeout_us,
        correlation_id=decoded.correlation_id,
        flags=decoded.flags,
        trace=trace is not None,
    )
    if trace is not None:
        trace.request_started(model.version, decoded.client_id, decoded.inputs)
    return PreparedRequest(request, slots)


def _place_inputs(
    dataplane: DataPlane,
    decoded: DecodedRequest,
    model_name: str,
    request_id: int,
    slots: list[Slot],
    body: BodySlot | None = None,
) -> list[TensorRef]:
    """One copy into a fresh slot per input (appended to ``slots`` as allocated), the
    registry's reference for an input in client shared memory (no copy), or a reference into
    the body's slot for an aligned binary input of a body read into the arena (no copy). The
    registry's framing errors of Triton's core get the request's id, as ``validate_request``
    gives them for data in the body."""
    refs: list[TensorRef] = []
    for tensor in decoded.inputs:
        shm = tensor.shm
        if shm is not None:
            try:
                refs.append(dataplane.shared_memory.resolve_input(
                    request_id, shm.region, shm.offset, shm.byte_size, tensor.name,
                    tensor.datatype, tensor.shape, model_name=model_name))
            except RequestCheckError as error:
                raise tagged(error, decoded.client_id) from None
            continue
        if body is not None and tensor.body_offset >= 0:
            offset = body.slot.offset + body.start + tensor.body_offset
            if offset % IN_PLACE_ALIGNMENT == 0:
                refs.append(TensorRef(tensor.name, tensor.datatype, tensor.shape,
                                      body.slot.region, offset, len(tensor.data)))
                continue
        slot = dataplane.allocate(len(tensor.data))
        slots.append(slot)
        if slot.nbytes:
            slot.view[:] = tensor.data
        refs.append(TensorRef(tensor.name, tensor.datatype, tensor.shape, slot.region,
                              slot.offset, slot.nbytes))
    return refs


def _requested_outputs(
    dataplane: DataPlane,
    plan: InferPlan,
    request_id: int,
) -> list[RequestedOutput]:
    if not plan.explicit_outputs:
        return []
    outputs: list[RequestedOutput] = []
    for output in plan.outputs:
        shm = output.shm
        target = None if shm is None else dataplane.shared_memory.resolve_output(
            request_id, shm.region, shm.offset, shm.byte_size, output.name)
        outputs.append(RequestedOutput(output.name, output.parameters, target))
    return outputs


@contextlib.asynccontextmanager
async def closing(answers: AsyncIterator[_Item]) -> AsyncGenerator[AsyncIterator[_Item], None]:
    """Close an answer iterator (``DataPlane.infer_stream``'s async generator) however the block
    ends: leaving before the final answer cancels the request."""
    try:
        yield answers
    finally:
        aclose = getattr(answers, "aclose", None)
        if aclose is not None:
            await aclose()
