"""Device tensors in the pytorch backend (CUDA shared-memory extension).

Inputs: on a CUDA instance, an input a client placed in CUDA memory arrives as a typed torch
tensor on the device (``DeviceRegions.input_tensor``) for every non-BYTES, non-ragged config input
(``device_input_names``). ``assemble_on_device`` joins a batch's parts (numpy arrays, torch
tensors or both): a single part already on the device with the right dtype is used as is (zero
copy), anything else is copied once into the workspace.

Outputs: an output every request of the batch wants in a CUDA region stays a device tensor
(``device_output_names``); the worker then copies it device to device into each client's
allocation. Ownership as for host outputs: valid until the next ``execute``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from shoal.dtypes import torch_dtype
from shoal.workers.backends.base import BackendRequest
from shoal.workers.batch_assembly import adjacent_view
from shoal.workers.device_regions import is_torch_tensor
from shoal.workers.workspace import WorkspacePool


def device_input_names(device: Any, inputs: Iterable[tuple[str, str]],
                       ragged: Iterable[str]) -> frozenset[str]:
    """The inputs (``(name, wire datatype)``) a CUDA instance takes as device tensors."""
    if device.type != "cuda":
        return frozenset()
    return frozenset(name for name, datatype in inputs if datatype != "BYTES") - set(ragged)


def device_output_names(device: Any, batch: Sequence[BackendRequest],
                        excluded: Iterable[str] = ()) -> frozenset[str]:
    """The outputs (but ``excluded``) that every request of ``batch`` wants in a CUDA region;
    none on a CPU instance (its outputs go through the host anyway)."""
    if device.type == "cpu" or not batch:
        return frozenset()
    wanted = frozenset.intersection(*(request.device_outputs for request in batch))
    return wanted - frozenset(excluded)


def assemble_on_device(torch: Any, parts: Sequence[Any], datatype: str, device: Any,
                       workspace: WorkspacePool) -> Any:
    """One tensor of ``datatype`` (BF16: bfloat16) on ``device`` holding the rows of ``parts``
    (numpy arrays, BF16 as uint16 bits, and/or torch tensors) in order."""
    dtype: Any = torch_dtype(datatype)
    if len(parts) == 1:
        single = parts[0]
        if is_torch_tensor(single) and single.device == device and single.dtype == dtype:
            return single
    elif not any(is_torch_tensor(part) for part in parts):
        joined = adjacent_view(parts)  # one host->device copy when the rows lie back to back
        parts = [joined] if joined is not None else parts
    if len(parts) == 1:
        shape = tuple(int(d) for d in parts[0].shape)
    else:
        shape = (sum(int(part.shape[0]) for part in parts),
                 *(int(d) for d in parts[0].shape[1:]))
    tensor = workspace.take(math.prod(shape) * dtype.itemsize, dtype, shape)
    if len(parts) == 1:
        tensor.copy_(_as_tensor(torch, parts[0], datatype))
        return tensor
    row = 0
    for part in parts:
        rows = int(part.shape[0])
        tensor[row:row + rows].copy_(_as_tensor(torch, part, datatype))
        row += rows
    return tensor


def _as_tensor(torch: Any, part: Any, datatype: str) -> Any:
    if is_torch_tensor(part):
        return part
    tensor = torch.from_numpy(part)
    return tensor.view(torch.bfloat16) if datatype == "BF16" else tensor
