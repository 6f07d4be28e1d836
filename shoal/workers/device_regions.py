"""Clients' CUDA allocations as a worker sees them (CUDA shared-memory extension).

Mappings: one per ``(raw_handle, device_id)``, opened with ``CudaIpc`` on first use and cached,
least recently used first out past ``max_open``. The frontend checked each reference against the
registration; the worker checks it again, with integer arithmetic and before any access, against
``min(registered byte_size, the allocation's real size)``. Errors are INVALID_ARG naming the tensor
("input 'X'", "output 'Y'"), never the handle's bytes; a handle that cannot be opened fails only
the request that named it.

Threads: inputs are mapped by the main thread; outputs are written by whichever thread holds the
worker's output lock (a decoupled model answers from its own threads); forgets are queued by the
control thread (``queue_forget``) and applied by the main thread between batches
(``between_batches``). An internal lock guards the cache and is held across every copy in or out,
so no mapping closes mid-copy. The views ``input_tensor`` hands out escape that lock: they are
pinned (never evicted) until ``between_batches``.

Closing: forget, eviction and ``close`` drop the cache's reference to the mapping's tensor before
calling its ``close`` (the fake can only unmap once no view of it is left).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shoal.dtypes import numpy_dtype, torch_dtype
from shoal.errors import ShoalError, invalid_arg
from shoal.messages import CudaHandle, OutputTarget, TensorRef
from shoal.shm.cuda_ipc import CudaIpc, CudaIpcError, OpenedAllocation, create_cuda_ipc
from shoal.shm.tensors import array_from_buffer, tensor_nbytes, wire_nbytes, write_array
from shoal.workers.backends.base import takes_device_input

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

_Key = tuple[bytes, int]  # (raw_handle, device_id)


def is_torch_tensor(value: object) -> bool:
    """True for a ``torch.Tensor`` (without importing torch: none exists before it is imported)."""
    torch_module = sys.modules.get("torch")
    return torch_module is not None and isinstance(value, torch_module.Tensor)


def host_array(tensor: Any) -> npt.NDArray[Any]:
    """A torch tensor (any device) as a host numpy array; BF16 becomes uint16 bit patterns."""
    import torch

    host = tensor.detach().to("cpu").contiguous()
    if host.dtype == torch.bfloat16:
        bits: npt.NDArray[Any] = host.view(torch.int16).numpy().view(np.uint16)
        return bits
    array: npt.NDArray[Any] = host.numpy()
    return array


def zeros_like(value: Any) -> Any:
    """Zeros shaped and typed like ``value`` (a numpy array or a torch tensor, on its device)."""
    if is_torch_tensor(value):
        import torch

        return torch.zeros_like(value)
    return np.zeros_like(value)


class LazyCudaIpc:
    """A ``CudaIpc`` that builds the real one (``create_cuda_ipc``) on its first ``open``: a
    CPU-only server never loads libcuda. A failure to build it fails that open (and is retried
    on the next)."""

    def __init__(self, factory: Callable[[], CudaIpc] = create_cuda_ipc) -> None:
        self._factory = factory
        self._ipc: CudaIpc | None = None

    def open(self, raw_handle: bytes, device_id: int) -> OpenedAllocation:
        if self._ipc is None:
            self._ipc = self._factory()
        return self._ipc.open(raw_handle, device_id)


class DeviceRegions:
    def __init__(self, ipc: CudaIpc, max_open: int = 64) -> None:
        if max_open < 1:
            raise ValueError(f"max_open must be at least 1, got {max_open}")
        self._ipc = ipc
        self._max_open = max_open
        self._open: OrderedDict[_Key, OpenedAllocation] = OrderedDict()
        self._pinned: set[_Key] = set()  # mappings with views out in the current batch
        self._written: set[Any] = set()  # CUDA devices written since synchronize()
        self._lock = threading.RLock()
        self._forgets: list[CudaHandle] = []
        self._forget_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._open)

    # ------------------------------------------------------------------ mappings

    def allocation_slice(self, handle: CudaHandle, offset: int, nbytes: int, what: str
                         ) -> torch.Tensor:
        """Bytes ``[offset, offset + nbytes)`` of the allocation as a 1-D uint8 tensor (a view,
        valid until the mapping closes: forget, eviction or close). ``what`` names the tensor
        in errors, e.g. "input 'X'"."""
        if offset < 0 or nbytes < 0:
            raise invalid_arg(f"CUDA shared memory offset and size of {what} must not be "
                              "negative")
        end = offset + nbytes
        if end > handle.byte_size:
            raise invalid_arg(f"CUDA shared memory region of {what} holds {handle.byte_size} "
                              f"bytes, the request needs {end}")
        with self._lock:
            tensor = self._opened(handle, what).tensor
            size = int(tensor.numel())
            if end > size:
                raise invalid_arg(f"CUDA shared memory region of {what} is smaller than "
                                  f"registered: the allocation holds {size} bytes, the request "
                                  f"needs {end}")
            view: torch.Tensor = tensor[offset:end]
            return view

    def _opened(self, handle: CudaHandle, what: str) -> OpenedAllocation:
        key = (handle.raw_handle, handle.device_id)
        opened = self._open.get(key)
        if opened is not None:
            self._open.move_to_end(key)
            return opened
        try:
            opened = self._ipc.open(handle.raw_handle, handle.device_id)
        except CudaIpcError as exc:
            logger.warning("cannot open the CUDA shared memory region of %s: %s", what, exc)
            raise invalid_arg(f"CUDA shared memory region of {what} cannot be opened: {exc}"
                              ) from None
        except Exception as exc:  # e.g. torch cannot wrap the pointer; the worker stays up
            logger.exception("cannot open the CUDA shared memory region of %s", what)
            raise invalid_arg(f"CUDA shared memory region of {what} cannot be opened: "
                              f"{type(exc).__name__}: {exc}") from None
        self._open[key] = opened
        self._evict_over_cap(keep=key)
        return opened

    def _evict_over_cap(self, keep: _Key | None = None) -> None:
        """Close least recently used mappings past ``max_open``; pinned ones and ``keep`` (the
        one being handed out) stay, even over the cap, until ``between_batches``."""
        for key in [k for k in self._open if k not in self._pinned and k != keep]:
            if len(self._open) <= self._max_open:
                return
            self._close_mapping(key)

    def _close_mapping(self, key: _Key) -> None:
        opened = self._open.pop(key)
        self._pinned.discard(key)
        close, device = opened.close, opened.tensor.device
        opened.tensor = None  # the cache's reference goes first: close() must find no view
        del opened
        try:
            if device.type == "cuda":  # no kernel or copy may still read it (rare: no hot path)
                import torch

                torch.cuda.synchronize(device)
            close()
        except Exception:
            logger.warning("closing a CUDA shared memory mapping failed", exc_info=True)

    def forget(self, handles: Iterable[CudaHandle]) -> None:
        """Close the mappings of these registrations (no request may use them any more)."""
        with self._lock:
            for handle in handles:
                key = (handle.raw_handle, handle.device_id)
                if key in self._open:
                    self._close_mapping(key)

    def queue_forget(self, handles: Iterable[CudaHandle]) -> None:
        """Any thread: forget these at the next ``between_batches``."""
        with self._forget_lock:
            self._forgets.extend(handles)

    def between_batches(self) -> None:
        """Main thread, while no ``execute`` runs: the batch's views are no longer used (unpin
        them), apply queued forgets and trim the cache to ``max_open``."""
        with self._forget_lock:
            handles, self._forgets = self._forgets, []
        with self._lock:
            self._pinned.clear()
            self.forget(handles)
            self._evict_over_cap()

    def close(self) -> None:
        with self._lock:
            for key in list(self._open):
                self._close_mapping(key)

    # ------------------------------------------------------------------ inputs

    def input_value(self, ref: TensorRef, backend: object, device: str) -> Any:
        """``ref``'s tensor as ``backend`` takes it: a typed torch tensor on ``device`` when it
        says so for that input (``takes_device_input``), else a host numpy array."""
        if takes_device_input(backend, ref.name):
            return self.input_tensor(ref, device)
        return self.input_array(ref)

    def input_array(self, ref: TensorRef) -> npt.NDArray[Any]:
        """One device->host copy, parsed like a system shared-memory input (BYTES framing
        checked; BF16 as uint16 bit patterns). The array owns its memory."""
        what = f"input '{ref.name}'"
        assert ref.cuda is not None, what
        with self._lock:
            host = self.allocation_slice(ref.cuda, ref.offset, ref.nbytes, what).to(
                "cpu", copy=True)
        try:
            return array_from_buffer(host.numpy().data, ref.datatype, ref.shape)
        except ShoalError as exc:
            raise invalid_arg(f"{what} in CUDA shared memory: {exc.message}") from None

    def input_tensor(self, ref: TensorRef, device: str) -> torch.Tensor:
        """A tensor of ``ref``'s dtype (BF16: bfloat16) and shape on ``device``: a view of the
        client's memory (zero copy, pinned until ``between_batches``) when it is on that device
        and ``offset`` is aligned for the dtype, else a copy."""
        import torch

        what = f"input '{ref.name}'"
        assert ref.cuda is not None, what
        if ref.datatype == "BYTES":
            raise invalid_arg(f"{what}: BYTES tensors cannot be given as device tensors")
        try:
            expected = tensor_nbytes(ref.datatype, ref.shape)
        except ShoalError as exc:
            raise invalid_arg(f"{what}: {exc.message}") from None
        if ref.nbytes != expected:
            raise invalid_arg(f"{what} of datatype {ref.datatype} and shape {list(ref.shape)} "
                              f"needs {expected} bytes, got {ref.nbytes}")
        dtype: Any = torch_dtype(ref.datatype)
        shape = tuple(int(d) for d in ref.shape)
        target = torch.device(device)
        with self._lock:
            source = self.allocation_slice(ref.cuda, ref.offset, ref.nbytes, what)
            if source.device == target and ref.offset % dtype.itemsize == 0:
                self._pinned.add((ref.cuda.raw_handle, ref.cuda.device_id))
                return source.view(dtype).view(shape)
            copy = torch.empty(expected, dtype=torch.uint8, device=target)
            copy.copy_(source)
        return copy.view(dtype).view(shape)

    # ------------------------------------------------------------------ outputs

    def write_output(self, target: OutputTarget, value: Any, datatype: str, name: str) -> int:
        """Copy output ``name`` into ``target``'s allocation and return the bytes written: a
        torch tensor by one tensor copy (device->device on an accelerator), anything else
        serialized on the host (BYTES framing) and copied host->device once. The copy may still
        run on the device when this returns: ``synchronize`` before answering."""
        import torch

        what = f"output '{name}'"
        assert target.cuda is not None, what
        if is_torch_tensor(value) and datatype != "BYTES":
            source = _tensor_bytes(value, datatype)
        else:
            source = torch.from_numpy(_host_bytes(value, datatype))
        nbytes = int(source.numel())
        if nbytes > target.nbytes:
            raise invalid_arg(f"shared memory size specified with the request for {what} "
                              f"({target.nbytes} bytes) should be at least {nbytes} bytes to "
                              "hold the results")
        with self._lock:
            dest = self.allocation_slice(target.cuda, target.offset, nbytes, what)
            dest.copy_(source)
            self._written.update(d for d in (dest.device, source.device) if d.type == "cuda")
        return nbytes

    def synchronize(self) -> None:
        """Wait for the copies into every CUDA device written since the last call (a no-op when
        none was: CPU tensors, as with the fake)."""
        if not self._written:  # the CPU case, once per response: no lock (a set's truth is
            return             # read atomically; a copy racing this call waits for the next)
        with self._lock:
            devices, self._written = self._written, set()
        if devices:
            import torch

            for device in devices:
                torch.cuda.synchronize(device)


def _tensor_bytes(value: Any, datatype: str) -> torch.Tensor:
    """``value`` cast to ``datatype`` as a contiguous 1-D uint8 tensor on its device."""
    import torch

    tensor = value.detach()
    dtype = torch_dtype(datatype)
    if tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    flat: torch.Tensor = tensor.contiguous().reshape(-1).view(torch.uint8)
    return flat


def _host_bytes(value: Any, datatype: str) -> npt.NDArray[np.uint8]:
    """``value`` as tensor bytes in host memory: the array itself when it already is (right
    dtype, contiguous, writable), else serialized into a new buffer."""
    if is_torch_tensor(value):
        value = host_array(value)
    if (datatype != "BYTES" and isinstance(value, np.ndarray)
            and value.dtype == numpy_dtype(datatype) and value.flags.c_contiguous
            and value.flags.writeable):
        same: npt.NDArray[np.uint8] = value.reshape(-1).view(np.uint8)
        return same
    buffer = np.empty(wire_nbytes(value, datatype), dtype=np.uint8)
    write_array(buffer.data, value, datatype)
    return buffer
