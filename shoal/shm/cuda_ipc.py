"""Opening clients' CUDA IPC memory handles inside a worker (CUDA shared-memory extension).

Contract: ``CudaIpc.open(raw_handle, device_id)`` maps a client's allocation from its 64-byte
``cudaIpcMemHandle_t`` and returns an ``OpenedAllocation``: a 1-D ``uint8`` torch tensor over the
whole allocation, from its base (``numel()`` is the allocation's real size), and ``close()``,
which unmaps it. The tensor does not own the memory: it is valid until ``close()``. Failures raise
``CudaIpcError`` with a reason that never repeats the handle's bytes.

Two implementations:

* ``DriverCudaIpc``: the CUDA driver API (``libcuda.so.1``) through ctypes, no extra package.
  It opens the handle in the device's primary context (the one torch uses), reads the real size
  with ``cuMemGetAddressRange`` and wraps the pointer with ``__cuda_array_interface__`` (no
  copy). Needs torch with CUDA.
* ``FakeCudaIpc``: for tests on machines without a GPU, chosen by ``SHOAL_FAKE_CUDA_IPC=1``
  in the server's environment. A fake handle names a POSIX shm object (``fake_handle``) and the
  "device memory" is a CPU tensor over its mapping; the server then reports one CUDA device.
  Everything around the driver calls (registration, checks, the worker's cache, copies in and
  out, unregistering) runs through the real processes with it. Never set it in production.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

IPC_HANDLE_BYTES: Final = 64  # CUDA_IPC_HANDLE_SIZE
FAKE_ENV: Final = "SHOAL_FAKE_CUDA_IPC"
_FAKE_MAGIC: Final = b"shoal-fake-cuda\x00"
_LAZY_ENABLE_PEER_ACCESS: Final = 0x1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS


class CudaIpcError(Exception):
    """A handle could not be opened or closed; ``str()`` says why."""


@dataclass(eq=False)
class OpenedAllocation:
    tensor: Any  # torch.Tensor, uint8, 1-D, the whole allocation
    close: Callable[[], None]


class CudaIpc(Protocol):
    def open(self, raw_handle: bytes, device_id: int) -> OpenedAllocation: ...


def fake_ipc_enabled(environ: dict[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get(FAKE_ENV, "") == "1"


def create_cuda_ipc() -> CudaIpc:
    """The implementation this process uses (see the module docstring)."""
    return FakeCudaIpc() if fake_ipc_enabled() else DriverCudaIpc()


# ---------------------------------------------------------------------------- the driver


class _IpcMemHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


def ipc_handle_struct(raw_handle: bytes) -> _IpcMemHandle:
    """The driver's ``CUipcMemHandle`` holding ``raw_handle``. A copy of the buffer: a
    ``memmove`` into ``handle.reserved`` would write into the bytes copy that reading a c_char
    array field returns and leave the struct zero (the driver then says "invalid argument";
    seen on an H200)."""
    return _IpcMemHandle.from_buffer_copy(raw_handle)


class _CudaArray:
    """Just enough of the CUDA array interface for ``torch.as_tensor`` to wrap a pointer."""

    def __init__(self, pointer: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (pointer, False), "version": 3,
            "strides": None, "stream": None,
        }


class DriverCudaIpc:
    """``cuIpcOpenMemHandle`` in the device's primary context. Thread-compatible: the worker
    calls it from its main thread only."""

    def __init__(self) -> None:
        try:
            self._lib: Any = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise CudaIpcError(f"the CUDA driver (libcuda.so.1) cannot be loaded: {exc}") from exc
        self._check(self._lib.cuInit(0), "cuInit")
        self._open_handle = self._symbol("cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle")
        # the handle is a 64-byte struct passed by value
        self._open_handle.argtypes = [ctypes.POINTER(ctypes.c_uint64), _IpcMemHandle,
                                      ctypes.c_uint]
        self._address_range = self._symbol("cuMemGetAddressRange_v2", "cuMemGetAddressRange")
        self._contexts: dict[int, ctypes.c_void_p] = {}

    def open(self, raw_handle: bytes, device_id: int) -> OpenedAllocation:
        import torch

        if len(raw_handle) != IPC_HANDLE_BYTES:
            raise CudaIpcError(f"a CUDA IPC handle has {IPC_HANDLE_BYTES} bytes, "
                               f"got {len(raw_handle)}")
        context = self._primary_context(device_id)
        self._check(self._lib.cuCtxPushCurrent_v2(context), "cuCtxPushCurrent")
        try:
            pointer = ctypes.c_uint64()
            handle = ipc_handle_struct(raw_handle)
            self._check(self._open_handle(ctypes.byref(pointer), handle,
                                          ctypes.c_uint(_LAZY_ENABLE_PEER_ACCESS)),
                        "cuIpcOpenMemHandle")
            base, size = ctypes.c_uint64(), ctypes.c_size_t()
            result = self._address_range(ctypes.byref(base), ctypes.byref(size), pointer)
            if result != 0 or base.value != pointer.value:
                self._lib.cuIpcCloseMemHandle(pointer)
                self._check(result, "cuMemGetAddressRange")
                raise CudaIpcError("the handle does not open at the start of its allocation")
        finally:
            self._lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        tensor = torch.as_tensor(_CudaArray(pointer.value, size.value),
                                 device=f"cuda:{device_id}")
        return OpenedAllocation(tensor, lambda: self._close(context, pointer))

    def _close(self, context: ctypes.c_void_p, pointer: ctypes.c_uint64) -> None:
        self._check(self._lib.cuCtxPushCurrent_v2(context), "cuCtxPushCurrent")
        try:
            self._check(self._lib.cuIpcCloseMemHandle(pointer), "cuIpcCloseMemHandle")
        finally:
            self._lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))

    def _primary_context(self, device_id: int) -> ctypes.c_void_p:
        context = self._contexts.get(device_id)
        if context is None:
            device = ctypes.c_int()
            self._check(self._lib.cuDeviceGet(ctypes.byref(device), device_id),
                        f"cuDeviceGet({device_id})")
            context = ctypes.c_void_p()
            self._check(self._lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
                        "cuDevicePrimaryCtxRetain")
            self._contexts[device_id] = context  # retained for the process's life, as torch does
        return context

    def _symbol(self, *names: str) -> Any:
        for name in names:
            function = getattr(self._lib, name, None)
            if function is not None:
                return function
        raise CudaIpcError(f"the CUDA driver has no {names[0]}")

    def _check(self, result: int, call: str) -> None:
        if result == 0:
            return
        text = ctypes.c_char_p()
        self._lib.cuGetErrorString(result, ctypes.byref(text))
        reason = text.value.decode() if text.value else f"CUresult {result}"
        raise CudaIpcError(f"{call} failed: {reason}")


# ---------------------------------------------------------------------------- the test fake


def fake_handle(shm_name: str) -> bytes:
    """The fake IPC handle of POSIX shm object ``shm_name`` (e.g. ``/my_region``)."""
    body = _FAKE_MAGIC + shm_name.lstrip("/").encode()
    if len(body) > IPC_HANDLE_BYTES:
        raise ValueError(f"shm name too long for a fake CUDA IPC handle: {shm_name!r}")
    return body.ljust(IPC_HANDLE_BYTES, b"\x00")


class FakeCudaIpc:
    """Maps the POSIX shm object a fake handle names; its whole size is the "allocation"."""

    def open(self, raw_handle: bytes, device_id: int) -> OpenedAllocation:
        import mmap

        import torch

        if len(raw_handle) != IPC_HANDLE_BYTES or not raw_handle.startswith(_FAKE_MAGIC):
            raise CudaIpcError("cuIpcOpenMemHandle failed: invalid argument")
        if device_id != 0:
            raise CudaIpcError(f"cuDeviceGet({device_id}) failed: invalid device ordinal")
        name = raw_handle[len(_FAKE_MAGIC):].rstrip(b"\x00").decode(errors="replace")
        if name.startswith("shoal-") or "/" in name or not name:  # never the server's own
            raise CudaIpcError("cuIpcOpenMemHandle failed: invalid argument")
        try:
            fd = os.open(os.path.join("/dev/shm", name), os.O_RDWR | os.O_NOFOLLOW)
        except OSError as exc:
            raise CudaIpcError("cuIpcOpenMemHandle failed: invalid argument") from exc
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                raise CudaIpcError("cuIpcOpenMemHandle failed: invalid argument")
            mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return OpenedAllocation(torch.frombuffer(mapping, dtype=torch.uint8),
                                lambda: _close_mapping(mapping))


def _close_mapping(mapping: Any) -> None:
    """Unmap now if no view of it is left (the caller dropped its tensor first), else when the
    last view is collected."""
    with contextlib.suppress(BufferError):
        mapping.close()
