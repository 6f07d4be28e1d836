"""Implicit sequence state in the worker: read a request's input states from the broker's state
segments and write the model's output states back (see ``messages.StateBinding``).

Contract: the input state is given to the model like any input (a view, no copy). After the
model answered, each output state it produced is checked (data type, declared dims, capacity)
and copied into its output buffer; it is removed from the response, since clients never see
state outputs. A request whose output state fails a check gets an error and writes nothing, so
the broker keeps its state as it was. Main thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shoal.errors import ErrorCode
from shoal.messages import Error, StateBinding, WorkerRequest, WrittenState
from shoal.shm.tensors import array_from_buffer, wire_nbytes, write_array
from shoal.workers.backends.base import BackendResponse

# (region, offset, nbytes) -> a writable view of the broker's state segment
ViewOf = Callable[[str, int, int], memoryview]


def state_inputs(request: WorkerRequest, view_of: ViewOf) -> dict[str, Any]:
    """The request's input states, by input name."""
    return {b.input_name: array_from_buffer(view_of(b.input_region, b.input_offset,
                                                    b.input_nbytes), b.datatype, b.shape)
            for b in request.states}


def requested_with_states(request: WorkerRequest) -> list[str]:
    """The outputs to ask the backend for: the client's, plus the output states (an empty list
    still means every output)."""
    names = [o.name for o in request.outputs]
    if names:
        names += [b.output_name for b in request.states if b.output_name not in names]
    return names


def write_output_states(request: WorkerRequest, response: BackendResponse, view_of: ViewOf
                        ) -> tuple[BackendResponse, list[WrittenState]] | Error:
    """Copy the output states out of ``response``; returns the response without them and what
    was written, or the Error that replaces the response."""
    bindings = {b.output_name: b for b in request.states}
    produced = {t.name: t for t in response.outputs if t.name in bindings}
    sizes: dict[str, int] = {}
    for name, tensor in produced.items():
        checked = _checked_nbytes(bindings[name], tensor.datatype, tensor.array)
        if isinstance(checked, str):
            return Error(ErrorCode.INVALID_ARG, checked)
        sizes[name] = checked
    written: list[WrittenState] = []
    for name, tensor in produced.items():
        binding, nbytes = bindings[name], sizes[name]
        view = view_of(binding.output_region, binding.output_offset, nbytes)
        write_array(view, tensor.array, tensor.datatype)
        written.append(WrittenState(name, list(tensor.array.shape), nbytes))
    if not produced:
        return response, written
    kept = [t for t in response.outputs if t.name not in bindings]
    return BackendResponse(outputs=kept, parameters=response.parameters), written


def _checked_nbytes(binding: StateBinding, datatype: str, array: Any) -> int | str:
    """The output state's size in bytes, or what is wrong with it."""
    name = binding.output_name
    if datatype != binding.datatype:
        return (f"output state '{name}' has data type {datatype}, but the state is declared "
                f"as {binding.datatype}")
    shape = list(array.shape)
    if len(shape) != len(binding.dims) or any(
            d >= 0 and d != s for d, s in zip(binding.dims, shape, strict=True)):
        return f"output state '{name}' has shape {shape}, but the state is declared {binding.dims}"
    nbytes = wire_nbytes(array, datatype)
    if nbytes > binding.capacity:
        return (f"output state '{name}' needs {nbytes} bytes, more than its state buffer of "
                f"{binding.capacity} bytes (model parameter 'shoal_state_buffer_bytes')")
    return nbytes
