"""Batch inputs and outputs as ONNX Runtime takes and gives them.

Numeric tensors go through IO binding with no copy: each input is an ``OrtValue`` over the
request's shared-memory view (or over the zero-copy view spanning a batch whose slices lie back
to back; else over one concatenation). An output whose full shape is known before the run
(fixed dims in the config) is bound to a buffer the worker lends from its output arena
(``InstanceContext.lend_output``): ONNX Runtime writes it there and the worker references it
in place, so it is never copied. Any other output is read as a numpy view of the ``OrtValue`` ONNX
Runtime allocated, which the worker copies once into its arena. BF16 outputs need a known shape
(numpy has no bfloat16: they are bound as uint16 buffers typed bfloat16).

ONNX Runtime's Python API cannot bind string tensors, so a model with a BYTES input or output
runs with ``session.run`` (numeric inputs still passed as views). Its strings are UTF-8: BYTES
elements are decoded (an element that is not UTF-8 is an INVALID_ARG error naming the input) and
string outputs are encoded back.

Ownership: an ``OrtRun`` keeps the bound input OrtValues and the output OrtValues alive until the
next run, so the output views stay valid until the worker has copied them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from shoal.dtypes import numpy_dtype
from shoal.errors import invalid_arg
from shoal.workers.backends.onnxruntime.graph_io import ONNX_BFLOAT16
from shoal.workers.batch_assembly import adjacent_view

Array = npt.NDArray[Any]


def join_rows(arrays: Sequence[Array]) -> Array:
    """The arrays of one input across a batch as one array: a zero-copy view when they lie back
    to back in one buffer (always for a single request), else one concatenation."""
    view = adjacent_view(arrays)
    if view is not None:
        return view
    return np.concatenate(arrays, axis=0)


def as_strings(name: str, array: Array) -> Array:
    """A BYTES input as the object array of ``str`` ONNX Runtime takes."""
    flat = array.reshape(-1)
    out = np.empty(flat.shape[0], dtype=np.object_)
    try:
        out[:] = [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in flat.tolist()]
    except UnicodeDecodeError:
        raise invalid_arg(f"input '{name}': a BYTES element is not valid UTF-8 (the "
                          "onnxruntime backend passes strings as UTF-8)") from None
    return out.reshape(array.shape)


def as_bytes(array: Array) -> Array:
    """A string output as an object array of ``bytes``."""
    flat = array.reshape(-1)
    out = np.empty(flat.shape[0], dtype=np.object_)
    out[:] = [x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in flat.tolist()]
    return out.reshape(array.shape)


class OrtRun:
    """Runs one session with IO binding or ``session.run`` (see the module docstring)."""

    def __init__(self, ort: Any, session: Any, run_options: Any, *, strings: bool,
                 lend: Callable[[int], memoryview | None] | None = None) -> None:
        self._ort = ort
        self._lend = lend
        self._session = session
        self._run_options = run_options
        self._strings = strings
        self._kept: list[Any] = []  # this run's OrtValues and binding (see Ownership)
        # input name -> address of the memory ONNX Runtime read it from (last bound run)
        self.bound_inputs: dict[str, int] = {}

    def run(self, feeds: Mapping[str, Array], bf16_inputs: frozenset[str],
            outputs: Sequence[str], known: Mapping[str, tuple[str, tuple[int, ...]]]
            ) -> dict[str, Array]:
        """Output name -> array (BF16 as uint16). ``known`` gives the wire data type and full
        shape of each output whose shape is known before the run (every BF16 output must be)."""
        self._kept = []
        self.bound_inputs = {}
        if self._strings:
            return self._run_plain(feeds, outputs)
        ort = self._ort
        binding = self._session.io_binding()
        self._kept.append(binding)
        for name, array in feeds.items():
            value = (ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array, ONNX_BFLOAT16)
                     if name in bf16_inputs else ort.OrtValue.ortvalue_from_numpy(array))
            self._kept.append(value)
            self.bound_inputs[name] = int(value.data_ptr())
            binding.bind_ortvalue_input(name, value)
        ours: dict[str, Array] = {}
        for name in outputs:
            spec = known.get(name)
            if spec is None:
                binding.bind_output(name, "cpu")
                continue
            datatype, shape = spec
            buffer = self._output_buffer(datatype, shape)
            value = (ort.OrtValue.ortvalue_from_numpy_with_onnx_type(buffer, ONNX_BFLOAT16)
                     if datatype == "BF16" else ort.OrtValue.ortvalue_from_numpy(buffer))
            self._kept.append(value)
            binding.bind_ortvalue_output(name, value)
            ours[name] = buffer
        self._session.run_with_iobinding(binding, self._run_options)
        values = binding.get_outputs()
        self._kept.extend(values)
        return {name: ours[name] if name in ours else value.numpy()
                for name, value in zip(outputs, values, strict=True)}

    def _output_buffer(self, datatype: str, shape: tuple[int, ...]) -> Array:
        """A lent arena buffer for the output when the worker lends one, else a new array."""
        dtype = numpy_dtype(datatype)
        count = int(np.prod(shape, dtype=np.int64))
        view = self._lend(count * dtype.itemsize) if self._lend is not None and count else None
        if view is None:
            return np.empty(shape, dtype=dtype)
        return np.frombuffer(view, dtype=dtype, count=count).reshape(shape)

    def _run_plain(self, feeds: Mapping[str, Array], outputs: Sequence[str]) -> dict[str, Array]:
        results = self._session.run(list(outputs), dict(feeds), self._run_options)
        return {name: as_bytes(value) if value.dtype.hasobject else value
                for name, value in zip(outputs, results, strict=True)}

    def release(self) -> None:
        self._kept = []
