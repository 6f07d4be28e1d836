"""A pytorch model's outputs -> each request's arrays (docs/architecture.md §7, the pytorch
backend).

- ``output_array``: one value ``forward()`` returned for a config output, checked against the
  config (its datatype, Triton's messages; no scalar when the model batches) and made a host
  array: a ``List[str]`` becomes a BYTES object array, a tensor a numpy array, copied when it
  may alias a zero-copy input (``sources``); an output the client wants in CUDA memory stays a
  (detached) device tensor, which the worker copies device to device.
- ``request_pieces``: that array cut into one piece per request of the batch: by rows (each
  request's batch size) when the model batches, by the source input's shapes for a
  ``batch_output`` target (``ragged.RaggedConfig.split_output``); every piece in its config
  ``dims`` when the output has a ``reshape``. A piece is a view of the output.
Problems raise ``ShoalError`` (INVALID_ARG for a config mismatch, INTERNAL for a wrong batch
dimension); the backend fails the batch's requests with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from shoal.dtypes import wire_to_config
from shoal.errors import ErrorCode, ShoalError
from shoal.workers.backends.torchscript_io import IoSpec, reshape_output, wire_of_torch
from shoal.workers.batch_assembly import copy_if_aliases, split_rows
from shoal.workers.device_regions import host_array
from shoal.workers.ragged import RaggedConfig

Array = npt.NDArray[Any]


def output_array(torch: Any, spec: IoSpec, value: Any, sources: list[Array], *,
                 expected_dtype: Any, batched: bool, on_device: bool = False) -> Array:
    """The checked output as a host array (a torch tensor when ``on_device``);
    ``expected_dtype``: the torch dtype of the config's datatype (None for BYTES)."""
    if isinstance(value, list):
        if spec.datatype != "BYTES":
            raise ShoalError(ErrorCode.INVALID_ARG,
                             f"configuration expects datatype {wire_to_config(spec.datatype)} "
                             f"for output '{spec.name}', model provides TYPE_STRING")
        strings = np.empty(len(value), dtype=np.object_)
        strings[:] = [s.encode("utf-8") for s in value]
        return strings
    if value.dtype != expected_dtype:
        provided = wire_of_torch(torch, value.dtype)
        raise ShoalError(ErrorCode.INVALID_ARG,
                         f"configuration expects datatype {wire_to_config(spec.datatype)} "
                         f"for output '{spec.name}', model provides "
                         f"{wire_to_config(provided) if provided else value.dtype}")
    if batched and value.dim() == 0:
        raise ShoalError(ErrorCode.INVALID_ARG,
                         f"output '{spec.name}' is a scalar which is not supported.")
    if on_device:
        device_value: Array = value.detach()  # the worker copies it device to device
        return device_value
    return copy_if_aliases(host_array(value), sources)


def request_pieces(spec: IoSpec, array: Array, sizes: list[int], *, batched: bool,
                   ragged: RaggedConfig,
                   source_shapes: Sequence[dict[str, tuple[int, ...]]]) -> list[Array]:
    """``array`` (output ``spec`` of the whole batch) cut into one piece per request;
    ``sizes``: each request's batch size; ``source_shapes``: each request's input shapes (only
    read for a ``batch_output`` target)."""
    scatter = ragged.scatter_outputs.get(spec.name)
    if scatter is not None:
        parts = ragged.split_output(scatter, array,
                                    [shapes[scatter.source] for shapes in source_shapes])
        return [reshape_output(spec, part, (size,) if batched else ())
                for part, size in zip(parts, sizes, strict=True)]
    if not batched:
        return [reshape_output(spec, array, ())]
    total = sum(sizes)
    if array.ndim == 0 or array.shape[0] != total:
        raise ShoalError(ErrorCode.INTERNAL,
                         f"output '{spec.name}' has shape {list(array.shape)}, expected "
                         f"batch dimension {total}")
    parts = split_rows(array, sizes)
    return parts if spec.reshape is None else [
        reshape_output(spec, part, (size,)) for part, size in zip(parts, sizes, strict=True)]
