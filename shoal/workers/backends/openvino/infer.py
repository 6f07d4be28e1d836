"""One OpenVINO inference over the server's buffers.

Inputs: each input is handed to OpenVINO as a tensor over the request's shared-memory view (or
over the zero-copy view spanning a batch whose slices lie back to back; else over one
concatenation), so OpenVINO reads the frontend's arena directly. Shared-memory views are
read-only, and OpenVINO's Python binding wraps only writable arrays: the view is re-typed as a
writable array over the same address (OpenVINO never writes an input tensor; the mapping stays
read-only, so a write would fault rather than corrupt the frontend's data).

Outputs: an output whose full shape is known before the run (fixed dims in the config) is set
to a buffer the worker lends from its output arena (``InstanceContext.lend_output``): OpenVINO
writes it there and the worker references it in place, so it is never copied. Any other output
is read as a numpy view of the tensor OpenVINO allocated, which the worker copies once.

Ownership: an ``OvRun`` keeps this run's tensors alive until the next run, so the output views
stay valid until the worker has copied them. Every known-shape output is set again before each
run, so OpenVINO never writes into a buffer lent for an earlier batch.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from shoal.dtypes import numpy_dtype

Array = npt.NDArray[Any]


def shareable(array: Array) -> Array:
    """``array`` as a C-contiguous, writable array OpenVINO can wrap without a copy: itself when
    it already is one, a writable alias of the same memory when it is only read-only, else a
    contiguous copy."""
    if not array.flags.c_contiguous:
        return np.ascontiguousarray(array)
    if array.flags.writeable or array.nbytes == 0:
        return array if array.flags.writeable else array.copy()
    raw = (ctypes.c_char * array.nbytes).from_address(array.ctypes.data)
    alias: Array = np.frombuffer(memoryview(raw).cast("B"), dtype=array.dtype)
    return alias.reshape(array.shape)


class OvRun:
    """Runs one infer request (see the module docstring)."""

    def __init__(self, ov: Any, request: Any,
                 lend: Callable[[int], memoryview | None] | None = None) -> None:
        self._ov = ov
        self._request = request
        self._lend = lend
        self._kept: list[Any] = []
        # input name -> address of the memory OpenVINO read it from (last run)
        self.bound_inputs: dict[str, int] = {}

    def run(self, feeds: Mapping[str, Array], outputs: Sequence[str],
            known: Mapping[str, tuple[str, tuple[int, ...]]]) -> dict[str, Array]:
        """Output name -> array. ``known`` gives the wire data type and full shape of each
        output whose shape is known before the run."""
        ov = self._ov
        self._kept = []
        self.bound_inputs = {}
        for name, array in feeds.items():
            tensor = ov.Tensor(shareable(array), shared_memory=True)
            self._kept.append(tensor)
            self.bound_inputs[name] = int(tensor.data.ctypes.data)
            self._request.set_tensor(name, tensor)
        ours: dict[str, Array] = {}
        for name, (datatype, shape) in known.items():
            buffer = self._output_buffer(datatype, shape)
            tensor = ov.Tensor(buffer, shared_memory=True)
            self._kept.append(tensor)
            self._request.set_tensor(name, tensor)
            ours[name] = buffer
        self._request.infer()
        produced: dict[str, Array] = {}
        for name in outputs:
            if name in ours:
                produced[name] = ours[name]
                continue
            tensor = self._request.get_tensor(name)
            self._kept.append(tensor)
            produced[name] = tensor.data
        return produced

    def _output_buffer(self, datatype: str, shape: tuple[int, ...]) -> Array:
        """A lent arena buffer for the output when the worker lends one, else a new array."""
        dtype = numpy_dtype(datatype)
        count = int(np.prod(shape, dtype=np.int64))
        view = self._lend(count * dtype.itemsize) if self._lend is not None and count else None
        if view is None:
            return np.empty(shape, dtype=dtype)
        return np.frombuffer(view, dtype=dtype, count=count).reshape(shape)

    def release(self) -> None:
        self._kept = []
