"""A CUDA IPC stand-in for machines without a GPU, plugged in through the server's provider hook
(``SHOAL_CUDA_IPC_PROVIDER``, see ``shoal.shm.cuda_ipc``).

A fake handle names a POSIX shm object (``fake_handle``) and the "device memory" is a CPU tensor
over its mapping; the server then reports one CUDA device (``FakeCudaIpc.device_count``).
Everything around the driver calls (registration, checks, the worker's cache, copies in and out,
unregistering) runs through the real processes with it. ``FAKE_IPC_ENV`` is the environment a
server needs to use it: the provider and a ``PYTHONPATH`` under which its processes (frontends,
broker, workers) import this module."""

from __future__ import annotations

import contextlib
import mmap
import os
import pathlib
from typing import Any, Final

from shoal.shm.cuda_ipc import IPC_HANDLE_BYTES, PROVIDER_ENV, CudaIpcError, OpenedAllocation

PROVIDER: Final = "tests.fakes.cuda_ipc:FakeCudaIpc"
_MAGIC: Final = b"shoal-fake-cuda\x00"
_REPO_ROOT: Final = str(pathlib.Path(__file__).resolve().parents[2])


def _pythonpath() -> str:
    """The repository root (where ``tests`` is a package), then the caller's own PYTHONPATH."""
    inherited = os.environ.get("PYTHONPATH", "")
    return _REPO_ROOT + (os.pathsep + inherited if inherited else "")


# environment entries for a server that uses the fake (merge them into its environment)
FAKE_IPC_ENV: Final[dict[str, str]] = {PROVIDER_ENV: PROVIDER, "PYTHONPATH": _pythonpath()}


def fake_handle(shm_name: str) -> bytes:
    """The fake IPC handle of POSIX shm object ``shm_name`` (e.g. ``/my_region``): 64 bytes.
    ValueError if the name does not fit."""
    body = _MAGIC + shm_name.lstrip("/").encode()
    if len(body) > IPC_HANDLE_BYTES:
        raise ValueError(f"shm name too long for a fake CUDA IPC handle: {shm_name!r}")
    return body.ljust(IPC_HANDLE_BYTES, b"\x00")


class FakeCudaIpc:
    """Maps the POSIX shm object a fake handle names; its whole size is the "allocation". Refuses
    with the driver's texts what the driver would refuse: anything but a fake handle of an
    existing, non-empty client object (never the server's own ``shoal-`` objects), and any
    device but 0."""

    device_count = 1  # the server reports one CUDA device (shoal.shm.cuda_ipc's hook)

    def open(self, raw_handle: bytes, device_id: int) -> OpenedAllocation:
        import torch

        if len(raw_handle) != IPC_HANDLE_BYTES or not raw_handle.startswith(_MAGIC):
            raise CudaIpcError("cuIpcOpenMemHandle failed: invalid argument")
        if device_id != 0:
            raise CudaIpcError(f"cuDeviceGet({device_id}) failed: invalid device ordinal")
        name = raw_handle[len(_MAGIC):].rstrip(b"\x00").decode(errors="replace")
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
