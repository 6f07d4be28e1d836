"""The frontend's registry of client shared-memory regions, system and CUDA
(``ClientSharedMemoryRegistry``): the implementation of ``shm_contract.SharedMemoryRegistry``,
whose docstring says what it guarantees (docs/architecture.md §4). ``RegionStatus`` and
``CudaRegionStatus`` are re-exported here for the callers that still import them from this module.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TypeVar

from shoal import dtypes
from shoal.errors import ErrorCode, ShoalError, invalid_arg, not_found, unavailable, unsupported
from shoal.frontend.core.shm_checks import (
    check_bytes_framing,
    check_region_name,
    current_object,
    object_size,
    open_client_object,
    registered_object,
    validated_key_body,
)
from shoal.frontend.shm_contract import DISABLED_MESSAGE
from shoal.frontend.shm_contract import CudaRegionStatus as CudaRegionStatus
from shoal.frontend.shm_contract import RegionStatus as RegionStatus
from shoal.frontend.shm_regions import CudaRegion, Registration, SystemRegion
from shoal.messages import ClientRegion, CudaHandle, OutputTarget, TensorRef
from shoal.settings import FrontendSettings
from shoal.shm.cuda_ipc import IPC_HANDLE_BYTES
from shoal.shm.object_identity import SHM_DIRECTORY, ObjectIdentity

logger = logging.getLogger(__name__)

_Kind = TypeVar("_Kind", SystemRegion, CudaRegion)


def _no_forget(handles: list[CudaHandle]) -> None:
    pass


def _no_report(region: ClientRegion) -> None:
    pass


def _no_report_end(name: str) -> None:
    pass


class ClientSharedMemoryRegistry:
    """The frontend's registry of system and CUDA regions (see ``SharedMemoryRegistry``).

    Unregistering a region takes its name away at once (status no longer lists it, new requests
    cannot use it, the name may be registered again); a system object stays open, and counted
    against the caps, until the last request that uses it ends (``release_request``); a CUDA
    registration is counted until then too, and is then passed to ``on_cuda_forget`` (one call
    per unregister / release / close, with each handle no live registration still names), which
    tells the workers to unmap it. Each registration that is taken, and each that ends, is
    reported (``on_registered`` / ``on_unregistered``: the broker keeps them for a frontend
    that replaces this one after a crash, see ``restore``). A system registration records its
    object's identity; every use checks that its key still names that object
    (``shm_checks.current_object``) and every reference carries it to the worker that maps
    it. ``euid`` / ``stat_of``: parameters for tests (the owner allowed, default this
    process's effective uid; the fstat used at registration). Threads: the frontend's event
    loop only; nothing here blocks (opens are O_NONBLOCK)."""

    def __init__(self, settings: FrontendSettings, shm_directory: str = SHM_DIRECTORY,
                 on_cuda_forget: Callable[[list[CudaHandle]], None] = _no_forget,
                 on_registered: Callable[[ClientRegion], None] = _no_report,
                 on_unregistered: Callable[[str], None] = _no_report_end, *,
                 euid: int | None = None,
                 stat_of: Callable[[int], os.stat_result] = os.fstat) -> None:
        self._enabled = settings.client_shm.allowed
        self._allow_foreign_owner = settings.client_shm.allow_foreign_owner
        self._euid = euid
        self._stat_of = stat_of
        # registrations live in one frontend process: with several behind one port, a client's
        # next connection may reach a frontend that never saw its region
        self._single_frontend = settings.http.workers <= 1
        self._max_regions = settings.client_shm.max_regions
        # bounds host mappings (system objects) only: CUDA allocations are the client's device
        # memory, mapped by workers, never by this process
        self._max_bytes = settings.client_shm.max_bytes
        self._directory = shm_directory
        self._on_cuda_forget = on_cuda_forget
        self._on_registered = on_registered
        self._on_unregistered = on_unregistered
        self._regions: dict[str, Registration] = {}
        self._retiring: set[Registration] = set()
        self._in_use: dict[int, list[Registration]] = {}
        self._open_bytes = 0

    @property
    def enabled(self) -> bool:
        return self._enabled

    # ------------------------------------------------------------------ registration

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        identity = self._register_system(name, key, offset, byte_size)
        self._on_registered(ClientRegion(name, key, offset, byte_size, object_dev=identity.dev,
                                         object_ino=identity.ino))

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int,
                      device_count: int) -> None:
        handle = self._register_cuda(name, raw_handle, device_id, byte_size, device_count)
        self._on_registered(ClientRegion(name, cuda=handle))

    def restore(self, region: ClientRegion) -> None:
        if region.cuda is None:
            expected = ObjectIdentity(region.object_dev, region.object_ino)
            self._register_system(region.name, region.key, region.offset, region.byte_size,
                                  expected if region.object_ino else None)
            return
        cuda = region.cuda
        self._register_cuda(region.name, cuda.raw_handle, cuda.device_id, cuda.byte_size,
                            cuda.device_id + 1)

    def _register_system(self, name: str, key: str, offset: int, byte_size: int,
                         expected: ObjectIdentity | None = None) -> ObjectIdentity:
        """Open, check and record a system registration; its object's identity. ``expected``
        (a restore): the key must still name that very object."""
        self._check_registration(name, "system")
        body = validated_key_body(name, key)
        if offset < 0 or byte_size <= 0:
            raise invalid_arg(f"failed to register shared memory region '{name}': 'byte_size' "
                              "must be positive and 'offset' must not be negative")
        fd = open_client_object(self._directory, name, key, body)
        try:
            info = registered_object(fd, name, key, self._directory,
                                     allow_foreign_owner=self._allow_foreign_owner,
                                     euid=self._euid, stat_of=self._stat_of)
            identity, size = ObjectIdentity.of(info), info.st_size
            if expected is not None and identity != expected:
                raise invalid_arg(f"shared memory region '{name}' is no longer the object that "
                                  "was registered (its key now names another one)")
            if byte_size > size or offset > size - byte_size:
                raise invalid_arg(
                    f"failed to register shared memory region '{name}': offset {offset} + "
                    f"byte_size {byte_size} is past the end of shared memory object '{key}' "
                    f"({size} bytes)")
            self._check_caps(name, byte_size)
        except BaseException:
            os.close(fd)
            raise
        self._regions[name] = SystemRegion(name, key, "/" + body, offset, byte_size, fd,
                                           identity, os.path.join(self._directory, body))
        self._open_bytes += byte_size
        logger.info("registered system shared memory region %r: key %r, offset %d, %d bytes",
                    name, key, offset, byte_size)
        return identity

    def _register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int,
                       device_count: int) -> CudaHandle:
        self._check_registration(name, "cuda")
        where = f"failed to register CUDA shared memory region '{name}'"
        if len(raw_handle) != IPC_HANDLE_BYTES:
            raise invalid_arg(f"{where}: 'raw_handle' must be a {IPC_HANDLE_BYTES}-byte CUDA "
                              f"IPC memory handle, got {len(raw_handle)} bytes")
        if not 0 <= device_id < device_count:
            raise invalid_arg(f"{where}: 'device_id' {device_id} is not a CUDA device of this "
                              f"server (it has {device_count})")
        if byte_size <= 0:
            raise invalid_arg(f"{where}: 'byte_size' must be positive")
        self._check_caps(name, 0)
        handle = CudaHandle(bytes(raw_handle), device_id, byte_size)
        self._regions[name] = CudaRegion(name, handle)
        logger.info("registered CUDA shared memory region %r: device %d, %d bytes",
                    name, device_id, byte_size)
        return handle

    def unregister(self, name: str | None) -> None:
        self._unregister(name, SystemRegion)

    def cuda_unregister(self, name: str | None) -> None:
        self._unregister(name, CudaRegion)

    def status(self, name: str | None) -> list[RegionStatus]:
        return [RegionStatus(r.name, r.key, r.offset, r.byte_size)
                for r in self._chosen(name, SystemRegion)]

    def cuda_status(self, name: str | None) -> list[CudaRegionStatus]:
        return [CudaRegionStatus(r.name, r.handle.device_id, r.byte_size)
                for r in self._chosen(name, CudaRegion)]

    # ------------------------------------------------------------------ use by requests

    def resolve_input(self, request_id: int, region: str, offset: int, byte_size: int,
                      tensor: str, datatype: str, shape: list[int], *,
                      model_name: str = "") -> TensorRef:
        found = self._checked_slice(region, offset, byte_size, f"input '{tensor}'")
        if datatype != "BYTES":
            expected = dtypes.element_count(shape) * dtypes.element_size(datatype)
            if byte_size != expected:
                raise invalid_arg(
                    f"input byte size mismatch for input '{tensor}': shape "
                    f"[{','.join(map(str, shape))}] of {datatype} needs {expected} bytes, "
                    f"'shared_memory_byte_size' is {byte_size}")
        elif isinstance(found, SystemRegion):
            check_bytes_framing(found.fd, found.offset + offset, byte_size,
                                dtypes.element_count(shape), tensor, model_name)
        self._mark_in_use(request_id, found)
        if isinstance(found, CudaRegion):
            return TensorRef(tensor, datatype, list(shape), "", offset, byte_size,
                             cuda=found.handle)
        return TensorRef(tensor, datatype, list(shape), found.object_name,
                         found.offset + offset, byte_size, object_id=found.identity.ino,
                         object_dev=found.identity.dev)

    def resolve_output(self, request_id: int, region: str, offset: int, byte_size: int,
                       tensor: str) -> OutputTarget:
        found = self._checked_slice(region, offset, byte_size, f"output '{tensor}'")
        self._mark_in_use(request_id, found)
        if isinstance(found, CudaRegion):
            return OutputTarget("", offset, byte_size, cuda=found.handle)
        return OutputTarget(found.object_name, found.offset + offset, byte_size,
                            object_id=found.identity.ino, object_dev=found.identity.dev)

    def read_system(self, request_id: int, object_name: str, offset: int,
                    nbytes: int) -> bytes | None:
        """A copy of ``nbytes`` at ``offset`` of the client system object ``object_name`` that
        request ``request_id`` uses, or used until its answer came (any live registration of
        that object: ``pread`` on the registered descriptor, no mapping, so a client that
        truncates its object cannot fault this process); None when no live registration
        names the object or the object is shorter now."""
        region = self._system_region_of(request_id, object_name)
        if region is None:
            region = next((r for r in self._regions.values() if isinstance(r, SystemRegion)
                           and r.object_name == object_name and r.fd >= 0), None)
        if region is None:
            return None
        data = os.pread(region.fd, nbytes, offset)
        return data if len(data) == nbytes else None

    def write_system(self, request_id: int, object_name: str, offset: int,
                     data: memoryview) -> None:
        """Write ``data`` at ``offset`` of the client system object ``object_name`` that request
        ``request_id`` names as an output target (``pwrite``, no mapping). Raises ShoalError
        INVALID_ARG when the request holds no such region or the object was truncated."""
        region = self._system_region_of(request_id, object_name)
        if region is None or object_size(region.fd, region.name, region.key) < offset + len(
                data):
            raise invalid_arg(f"shared memory region for output of request {request_id} is no "
                              "longer available or was truncated")
        written = 0
        while written < len(data):
            written += os.pwrite(region.fd, data[written:], offset + written)

    def _system_region_of(self, request_id: int, object_name: str) -> SystemRegion | None:
        for region in self._in_use.get(request_id, ()):
            if isinstance(region, SystemRegion) and region.object_name == object_name \
                    and region.fd >= 0:
                return region
        return None

    def release_request(self, request_id: int) -> None:
        ended: list[Registration] = []
        for region in self._in_use.pop(request_id, ()):
            region.users.discard(request_id)
            if region.unregistered and not region.users:
                self._retiring.discard(region)
                ended.append(region)
        self._drop(ended)

    def close(self) -> None:
        everything = [*self._regions.values(), *self._retiring]
        self._regions.clear()
        self._retiring.clear()
        self._in_use.clear()
        self._drop(everything)

    # ------------------------------------------------------------------ helpers

    def _check_enabled(self) -> None:
        if not self._enabled:
            raise unsupported(DISABLED_MESSAGE)

    def _check_registration(self, name: str, kind: str) -> None:
        """What every register checks first: enabled, one frontend, the name free."""
        self._check_enabled()
        if not self._single_frontend:
            raise unsupported("client shared memory needs --http-workers=1: regions are "
                              "registered in one frontend process")
        check_region_name(name, kind)
        if name in self._regions:
            raise ShoalError(ErrorCode.ALREADY_EXISTS,
                             f"shared memory region '{name}' already in manager")

    def _check_caps(self, name: str, byte_size: int) -> None:
        if len(self._regions) + len(self._retiring) >= self._max_regions:
            raise unavailable(
                f"cannot register shared memory region '{name}': {self._max_regions} regions "
                "are registered or in use, the most this server allows "
                "(--client-shm-max-regions)")
        if byte_size > self._max_bytes - self._open_bytes:
            raise unavailable(
                f"cannot register shared memory region '{name}': {byte_size} more bytes would "
                f"exceed the {self._max_bytes} bytes of client regions this server allows "
                f"(--client-shm-max-bytes; {self._open_bytes} registered or in use)")

    def _unregister(self, name: str | None, kind: type[_Kind]) -> None:
        self._check_enabled()
        names = list(self._regions) if name is None else [name]
        ended: list[Registration] = []
        for region_name in names:
            region = self._regions.get(region_name)
            if not isinstance(region, kind):  # unknown, or of the other kind: nothing to do
                continue
            del self._regions[region_name]
            logger.info("unregistered %s shared memory region %r", region.kind, region_name)
            self._on_unregistered(region_name)
            if region.users:
                region.unregistered = True
                self._retiring.add(region)
            else:
                ended.append(region)
        self._drop(ended)

    def _chosen(self, name: str | None, kind: type[_Kind]) -> list[_Kind]:
        if name is None:
            return [r for n, r in sorted(self._regions.items()) if isinstance(r, kind)]
        region = self._regions.get(name)
        if isinstance(region, kind):
            return [region]
        if region is None:
            raise not_found(f"Unable to find {kind.kind.lower()} shared memory region: "
                            f"'{name}'")
        raise not_found(f"The region named '{name}' is registered as {region.kind} shared "
                        f"memory, not {kind.kind} shared memory")

    def _checked_slice(self, region: str, offset: int, byte_size: int,
                       what: str) -> Registration:
        """The registered region named ``region`` after checking that [offset, +byte_size)
        lies inside the registration and, for a system object, that its key still names the
        registered object (``current_object``) and the slice lies right now inside its size."""
        self._check_enabled()
        found = self._regions.get(region)
        if found is None:
            raise not_found(f"Unable to find shared memory region: '{region}' (used by {what})")
        if offset < 0 or byte_size < 0:
            raise invalid_arg(f"'shared_memory_offset' and 'shared_memory_byte_size' of {what} "
                              f"in shared memory region '{region}' must not be negative")
        if byte_size > found.byte_size or offset > found.byte_size - byte_size:
            raise invalid_arg(
                f"Invalid offset + byte size for shared memory region: '{region}': "
                f"'shared_memory_offset' {offset} + 'shared_memory_byte_size' {byte_size} of "
                f"{what} is past the end of the region ({found.byte_size} bytes)")
        if isinstance(found, SystemRegion):
            end = found.offset + offset + byte_size
            size = current_object(found.path, found.fd, region, found.key, found.identity,
                                  allow_foreign_owner=self._allow_foreign_owner,
                                  euid=self._euid).st_size
            if size < end:
                raise invalid_arg(
                    f"shared memory region '{region}' used by {what} was truncated: its object "
                    f"now holds {size} bytes, the request needs {end}")
        return found

    def _mark_in_use(self, request_id: int, region: Registration) -> None:
        if request_id not in region.users:
            region.users.add(request_id)
            self._in_use.setdefault(request_id, []).append(region)

    def _drop(self, ended: list[Registration]) -> None:
        """Registrations nobody uses any more: close system objects; forget CUDA handles that
        no live registration still names (workers map by handle and device, not by name)."""
        forgotten: dict[tuple[bytes, int], CudaHandle] = {}
        for region in ended:
            if isinstance(region, SystemRegion):
                self._close(region)
            else:
                forgotten[region.handle.raw_handle, region.handle.device_id] = region.handle
        for region in [*self._regions.values(), *self._retiring]:
            if isinstance(region, CudaRegion):
                forgotten.pop((region.handle.raw_handle, region.handle.device_id), None)
        if forgotten:
            try:
                self._on_cuda_forget(list(forgotten.values()))
            except Exception:  # the registry is consistent; workers keep a mapping (LRU-capped)
                logger.exception("could not tell the workers to forget %d CUDA registrations",
                                 len(forgotten))

    def _close(self, region: SystemRegion) -> None:
        if region.fd >= 0:
            os.close(region.fd)
            region.fd = -1
            self._open_bytes -= region.byte_size
