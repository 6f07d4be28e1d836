"""Triton's shared-memory extensions: client-registered regions (CONTRACT: what a registry of
them must guarantee; ``shm_registry.ClientSharedMemoryRegistry`` is the implementation).

Clients register a region name -> a POSIX shm object (system: key, offset, byte_size) or a CUDA
allocation (CUDA: IPC handle, device id, byte_size); inputs and requested outputs then name a
region plus ``shared_memory_offset`` / ``shared_memory_byte_size``. The tensor bytes never pass
through the frontend or the broker: the frontend only checks bounds and turns the reference into
a ``TensorRef`` (inputs) or an ``OutputTarget`` (outputs) pointing into the client's memory,
which the worker maps itself (CUDA: ``cuda`` set, ``region`` empty). Shared memory: see
docs/architecture.md §4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

from shoal.messages import ClientRegion, OutputTarget, TensorRef

DISABLED_MESSAGE: Final = (
    "client shared memory is disabled on this server; start it with --allow-client-shm=true "
    "to register and use shared-memory regions"
)


@dataclass(frozen=True)
class RegionStatus:
    name: str
    key: str
    offset: int
    byte_size: int


@dataclass(frozen=True)
class CudaRegionStatus:
    name: str
    device_id: int
    byte_size: int


class SharedMemoryRegistry(Protocol):
    """Guarantees: off unless enabled (--allow-client-shm): register/unregister/use then raise
    ShoalError(UNSUPPORTED) while status still works; system and CUDA regions share one name
    space, status/unregister see one kind each; every offset and size is checked with
    overflow-safe arithmetic; at register time a system object's real size (fstat) must cover
    offset + byte_size; internal segments (``/shoal-`` keys) can never be registered and their
    names never appear in errors; a system registration is of one object, by identity (st_dev,
    st_ino): it must have one link, be none of the server's segments and (unless
    --client-shm-allow-foreign-owner) be owned by the server's uid, and every use refuses the
    request, naming the region, unless its key still names that very object; references carry
    the identity so the worker maps only it (``shm/object_identity.py``); caps on region
    count (both kinds) and mapped bytes (system); a region used by an in-flight request is
    not unmapped (CUDA: not forgotten) until that request ends (unregister is deferred);
    errors name the region and the tensor.
    Single-threaded: the frontend's event loop."""

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None: ...

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int,
                      device_count: int) -> None:
        """A CUDA allocation: ``raw_handle`` is its 64-byte ``cudaIpcMemHandle_t``,
        ``device_id`` must be below ``device_count`` (the server's CUDA devices, probed by the
        caller), ``byte_size`` positive."""
        ...

    def unregister(self, name: str | None) -> None:
        """System regions. ``None`` unregisters every one. Unknown names, and names of CUDA
        regions, are not an error and do nothing (Triton)."""
        ...

    def cuda_unregister(self, name: str | None) -> None:
        """As ``unregister``, for CUDA regions."""
        ...

    def status(self, name: str | None) -> list[RegionStatus]:
        """System regions; ``name`` unknown or a CUDA region -> ShoalError(NOT_FOUND)."""
        ...

    def cuda_status(self, name: str | None) -> list[CudaRegionStatus]:
        """As ``status``, for CUDA regions."""
        ...

    def resolve_input(self, request_id: int, region: str, offset: int, byte_size: int,
                      tensor: str, datatype: str, shape: list[int], *,
                      model_name: str = "") -> TensorRef:
        """Checks that the region is registered, the slice lies inside it, and byte_size equals
        the tensor's byte size (fixed-size types); re-checks a system object's real size and
        BYTES framing (in a CUDA region the worker does; the texts of a request body's framing
        check, naming model ``model_name``); marks the region in use by
        ``request_id``. System: ``region`` is the object's key, the offset absolute within it
        (registration offset + shared_memory_offset). CUDA: ``region`` is "", ``cuda`` the
        registration, the offset counts from the allocation's start."""
        ...

    def resolve_output(self, request_id: int, region: str, offset: int, byte_size: int,
                       tensor: str) -> OutputTarget:
        """As resolve_input, for a requested output (its size is checked by the worker when it
        knows the output's shape: too small -> INVALID_ARG naming the output)."""
        ...

    def read_system(self, request_id: int, object_name: str, offset: int,
                    nbytes: int) -> bytes | None:
        """A copy of bytes of a system region the request uses (the response cache)."""
        ...

    def write_system(self, request_id: int, object_name: str, offset: int,
                     data: memoryview) -> None:
        """Write into a system region the request names as an output (the response cache)."""
        ...

    def release_request(self, request_id: int) -> None:
        """The request ended: its regions are no longer in use (deferred unregisters happen)."""
        ...

    def restore(self, region: ClientRegion) -> None:
        """Take over a registration that this frontend's index held before a restart (the
        broker kept it): checked as at register time (a system object must still exist and
        cover it; a CUDA device is not probed again), not reported again. Raises ShoalError
        when it cannot be taken over."""
        ...

    def close(self) -> None: ...
