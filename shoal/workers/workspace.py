"""Per-instance scratch memory reserved once at load (docs/architecture.md §4).

A ``WorkspacePool`` owns one byte buffer on the instance's device: a numpy buffer (shared with a
torch view) for "cpu", ``torch.empty(nbytes, dtype=uint8, device=...)`` for "cuda:N" / "npu:N".
Batch assembly bump-allocates tensors out of it with ``take`` and the backend calls ``reset``
once per batch. When the pool is sized for the model's largest batch, the hot path allocates no
device memory at all; a request that does not fit falls back to a fresh allocation and is counted
in ``fallback_allocations`` (a sign the pool is too small; see ``high_water_bytes``).

Threads: single-threaded use (the worker's main thread). Ownership: tensors handed out by
``take`` are views of the pool and are valid until the next ``reset``.

Sizing is pure (no torch) so that the broker can account for the pool before it starts a worker:
``pytorch_workspace_bytes`` is what the pytorch backend reserves, ``device_workspace_bytes`` what
one accelerator instance of any model reserves (0 for backends that keep no pool).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shoal.dtypes import config_to_wire, element_size
from shoal.errors import invalid_arg
from shoal.workers.ragged import RaggedConfig

if TYPE_CHECKING:
    import torch
    from tritonclient.grpc.model_config_pb2 import ModelConfig

logger = logging.getLogger(__name__)

ALIGNMENT = 256  # bytes; matches CUDA allocation alignment, enough for any vector load
DEFAULT_WORKSPACE_BYTES = 64 << 20  # when input dims are variable and no setting sizes the pool
WORKSPACE_SETTING = "workspace-bytes"  # --backend-config=pytorch,workspace-bytes=N


def align_up(nbytes: int, alignment: int = ALIGNMENT) -> int:
    return (nbytes + alignment - 1) // alignment * alignment


def pytorch_workspace_bytes(config: ModelConfig, backend_settings: Mapping[str, str], *,
                            on_cpu: bool) -> int:
    """Bytes of the pool a pytorch-backend instance of ``config`` reserves at load: the
    ``workspace-bytes`` backend setting when given; else 0 on the CPU without batching (inputs
    are used in place); else room for ``max_batch_size`` rows of every fixed-shape, non-BYTES
    input plus the generated ragged inputs, or DEFAULT_WORKSPACE_BYTES when a dim is variable.
    INVALID_ARG for a bad setting or ragged configuration."""
    setting = backend_settings.get(WORKSPACE_SETTING)
    if setting is not None:
        try:
            value = int(setting)
        except ValueError:
            value = -1
        if value < 0:
            raise invalid_arg(f"{WORKSPACE_SETTING} must be a non-negative integer, got "
                              f"'{setting}'")
        return value
    max_batch = int(config.max_batch_size)
    if on_cpu and max_batch == 0:
        return 0
    rows = max(max_batch, 1)
    ragged = RaggedConfig.from_model_config(config, str(config.name))
    total = align_up(ragged.workspace_bytes(rows, {str(io.name): tuple(int(d) for d in io.dims)
                                                   for io in config.input}))
    for io in config.input:
        datatype = config_to_wire(_data_type_name(io.data_type))
        if datatype == "BYTES":
            continue
        if any(d < 0 for d in io.dims):
            return DEFAULT_WORKSPACE_BYTES
        total += align_up(rows * math.prod(io.dims) * element_size(datatype))
    return total


def device_workspace_bytes(config: ModelConfig,
                           backend_config: Sequence[tuple[str, str, str]]) -> int:
    """Bytes of device memory the workspace pool of one accelerator (KIND_GPU) instance of
    ``config`` takes; ``backend_config`` is ``BackendSettings.config``. Only the pytorch backend
    keeps a pool; every other backend takes 0."""
    backend = str(config.backend)
    if backend != "pytorch":
        return 0
    settings = {key: value for name, key, value in backend_config if name in ("", backend)}
    return pytorch_workspace_bytes(config, settings, on_cpu=False)


def _data_type_name(data_type: int) -> str:
    from tritonclient.grpc import model_config_pb2 as pb

    # ValueType: int at run time, the enum's NewType in the stub (typings/)
    return str(pb.DataType.Name(pb.DataType.ValueType(data_type)))


class WorkspacePool:
    def __init__(self, device: str, nbytes: int) -> None:
        import torch

        if nbytes < 0:
            raise ValueError(f"workspace size must be >= 0, got {nbytes}")
        self.device = device
        self.capacity = nbytes
        self.fallback_allocations = 0
        self.high_water_bytes = 0
        self._offset = 0
        self._host: npt.NDArray[np.uint8] | None = None
        if torch.device(device).type == "cpu":
            self._host = np.empty(nbytes, dtype=np.uint8)
            self._buffer = torch.from_numpy(self._host)
        else:
            self._buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)

    @property
    def used_bytes(self) -> int:
        return self._offset

    def reset(self) -> None:
        """Forget every allocation; call once per batch before assembling it."""
        self._offset = 0

    def take(self, nbytes: int, dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor:
        """A tensor of ``shape``/``dtype`` carved from the pool (``nbytes`` must cover it), or a
        fresh allocation when the pool is exhausted."""
        import torch

        needed = math.prod(shape) * dtype.itemsize
        if nbytes < needed:
            raise ValueError(f"take({nbytes}) is smaller than shape {list(shape)} of {dtype} "
                             f"({needed} bytes)")
        start = self._reserve(needed)
        if start is None:
            return torch.empty(tuple(shape), dtype=dtype, device=self.device)
        return self._buffer[start:start + needed].view(dtype).view(tuple(shape))

    def take_numpy(self, dtype: npt.DTypeLike, shape: Sequence[int]) -> npt.NDArray[Any]:
        """Like ``take`` for a CPU pool, as a numpy array (for ``batch_assembly.concat_rows``)."""
        np_dtype = np.dtype(dtype)
        if self._host is None:
            raise ValueError(f"take_numpy needs a cpu workspace, this one is on {self.device}")
        needed = math.prod(shape) * np_dtype.itemsize
        start = self._reserve(needed)
        if start is None:
            return np.empty(tuple(shape), dtype=np_dtype)
        return self._host[start:start + needed].view(np_dtype).reshape(tuple(shape))

    def _reserve(self, nbytes: int) -> int | None:
        start = self._offset
        end = start + nbytes
        if end > self.capacity:
            self.fallback_allocations += 1
            logger.debug("workspace on %s exhausted (%d of %d bytes used, %d asked); allocating",
                         self.device, start, self.capacity, nbytes)
            return None
        self._offset = align_up(end)
        self.high_water_bytes = max(self.high_water_bytes, end)
        return start
