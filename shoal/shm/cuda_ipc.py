"""Opening clients' CUDA IPC memory handles inside a worker (CUDA shared-memory extension).

Contract: ``CudaIpc.open(raw_handle, device_id)`` maps a client's allocation from its 64-byte
``cudaIpcMemHandle_t`` and returns an ``OpenedAllocation``: a 1-D ``uint8`` torch tensor over the
whole allocation, from its base (``numel()`` is the allocation's real size), and ``close()``,
which unmaps it. The tensor does not own the memory: it is valid until ``close()``. Failures raise
``CudaIpcError`` with a reason that never repeats the handle's bytes.

The implementation a process uses is ``create_cuda_ipc()``'s:

* ``DriverCudaIpc`` (the default): the CUDA driver API (``libcuda.so.1``) through ctypes, no
  extra package. It opens the handle in the device's primary context (the one torch uses), reads
  the real size with ``cuMemGetAddressRange`` and wraps the pointer with
  ``__cuda_array_interface__`` (no copy). Needs torch with CUDA.
* A provider named by ``SHOAL_CUDA_IPC_PROVIDER="package.module:Name"`` in the server's
  environment (every process of the server inherits it): ``Name`` is a class that takes no
  constructor arguments and implements ``CudaIpc``; the worker builds one instance at its first
  open. The class may define an ``int`` class attribute ``device_count`` (at least 1): then the
  frontend reports that many CUDA devices to clients registering CUDA shared memory instead of
  asking torch (``provided_device_count``). A value that is not ``module:Name``, a module that
  does not import or a name that is not such a class raises ``ShoalError(INVALID_ARG)`` naming
  the variable. The stand-in that the tests use on machines without a GPU (a "handle" names a
  POSIX shm object) lives in ``tests/fakes/cuda_ipc.py``, not in this package.
"""

from __future__ import annotations

import ctypes
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from shoal.errors import invalid_arg

IPC_HANDLE_BYTES: Final = 64  # CUDA_IPC_HANDLE_SIZE
PROVIDER_ENV: Final = "SHOAL_CUDA_IPC_PROVIDER"
_LAZY_ENABLE_PEER_ACCESS: Final = 0x1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS


class CudaIpcError(Exception):
    """A handle could not be opened or closed; ``str()`` says why."""


@dataclass(eq=False)
class OpenedAllocation:
    tensor: Any  # torch.Tensor, uint8, 1-D, the whole allocation
    close: Callable[[], None]


class CudaIpc(Protocol):
    def open(self, raw_handle: bytes, device_id: int) -> OpenedAllocation: ...


def create_cuda_ipc() -> CudaIpc:
    """The implementation this process uses: an instance of the ``SHOAL_CUDA_IPC_PROVIDER``
    class when the variable is set, else ``DriverCudaIpc()`` (see the module docstring). Reads
    the environment at each call. Raises ``ShoalError(INVALID_ARG)`` for a bad provider and
    ``CudaIpcError`` where the driver cannot be loaded."""
    provider = _provider()
    return DriverCudaIpc() if provider is None else provider()


def provided_device_count() -> int | None:
    """How many CUDA devices the provider's class says the server has (its ``device_count``),
    None when no provider is set or its class does not say. Reads the environment at each
    call; raises ``ShoalError(INVALID_ARG)`` for a bad provider or a ``device_count`` that is
    not an int of at least 1."""
    provider = _provider()
    if provider is None:
        return None
    count = getattr(provider, "device_count", None)
    if count is None:
        return None
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise invalid_arg(f"{PROVIDER_ENV}: {provider.__qualname__}.device_count must be an "
                          f"int of at least 1, got {count!r}")
    return count


def _provider() -> type[CudaIpc] | None:
    """The class ``SHOAL_CUDA_IPC_PROVIDER`` names, imported now; None when unset or empty."""
    value = os.environ.get(PROVIDER_ENV, "")
    if not value:
        return None
    module_name, colon, attribute = value.partition(":")
    if not colon or not module_name or not attribute:
        raise invalid_arg(f"{PROVIDER_ENV} must be 'package.module:Name', got {value!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or whatever the module raised while importing
        # the text may reach clients (a registration's answer): no paths, the cause is chained
        why = (f"no module named {exc.name!r}" if isinstance(exc, ModuleNotFoundError)
               else type(exc).__name__)
        raise invalid_arg(f"{PROVIDER_ENV}={value!r}: module {module_name!r} cannot be "
                          f"imported ({why})") from exc
    provider = getattr(module, attribute, None)
    if not isinstance(provider, type) or not callable(getattr(provider, "open", None)):
        raise invalid_arg(f"{PROVIDER_ENV}={value!r}: {attribute!r} is not a class with an "
                          f"open(raw_handle, device_id) method in {module_name!r}")
    return provider


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
