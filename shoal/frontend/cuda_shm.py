"""CUDA shared-memory registration, transport-agnostic (HTTP and gRPC call
``register_cuda_region`` once they parsed the request): whether the server can use CUDA at all,
how many devices a registration may name, and the order of the checks. The frontend never
imports torch unless an NVIDIA device node exists, and then only off the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import os
from typing import TYPE_CHECKING, Final

from shoal.errors import invalid_arg, unsupported
from shoal.frontend.shm_contract import DISABLED_MESSAGE
from shoal.shm.cuda_ipc import provided_device_count

if TYPE_CHECKING:
    from shoal.frontend.shm_contract import SharedMemoryRegistry
    from shoal.settings import FrontendSettings

# device nodes without which no CUDA runtime (hence torch) can see a GPU: Linux driver, WSL
_CUDA_DEVICE_NODES: Final = ("/dev/nvidiactl", "/dev/dxg")
CUDA_SHM_NO_DEVICE: Final = "CUDA shared memory is not supported: torch sees no CUDA device"


@functools.cache
def torch_sees_cuda() -> bool:
    """``torch.cuda.is_available()``, without importing torch (hundreds of MB in the frontend)
    when no NVIDIA device node exists. Blocking; call it off the event loop."""
    if not any(os.path.exists(node) for node in _CUDA_DEVICE_NODES):
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@functools.cache
def cuda_device_count() -> int:
    """``torch.cuda.device_count()``, 0 when ``torch_sees_cuda()`` is false. Blocking (the
    first call); call it off the event loop."""
    if not torch_sees_cuda():
        return 0
    import torch

    return int(torch.cuda.device_count())


async def server_cuda_devices() -> int:
    """How many CUDA devices registrations may name (device ids ``0 .. n-1``): the
    ``device_count`` of the CUDA IPC provider's class where ``SHOAL_CUDA_IPC_PROVIDER`` names one
    that defines it (``shoal.shm.cuda_ipc.provided_device_count``; a bad provider raises its
    ShoalError(INVALID_ARG)), else torch's count, probed once in a thread.
    None -> ShoalError(UNSUPPORTED, CUDA_SHM_NO_DEVICE)."""
    provided = provided_device_count()
    if provided is not None:
        return provided
    count = await asyncio.to_thread(cuda_device_count)
    if count <= 0:
        raise unsupported(CUDA_SHM_NO_DEVICE)
    return count


async def register_cuda_region(registry: SharedMemoryRegistry, settings: FrontendSettings,
                               name: str, raw_handle: bytes, device_id: int,
                               byte_size: int) -> None:
    """CUDA register once a transport parsed the request (HTTP and gRPC): enabled, then a name
    (a client error on any server), then a device to register on, then the registry's checks."""
    if not settings.client_shm.allowed:
        raise unsupported(DISABLED_MESSAGE)
    if not name:
        raise invalid_arg("'region name' is necessary to register cuda shared memory region")
    device_count = await server_cuda_devices()
    registry.register_cuda(name, raw_handle, device_id, byte_size, device_count)
