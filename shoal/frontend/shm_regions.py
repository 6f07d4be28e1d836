"""The records of the client shared-memory registry (``shm_registry``), one per registration:
``SystemRegion`` (a POSIX shm object, held open by descriptor) or ``CudaRegion`` (a CUDA IPC
handle, nothing held), each with the ids of the requests using it now and whether it was
unregistered meanwhile (it then ends when the last of them does). Plain data: only the
registry changes them, on the frontend's event loop (docs/architecture.md §4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from shoal.messages import CudaHandle
from shoal.shm.object_identity import ObjectIdentity


@dataclass(eq=False)
class SystemRegion:
    """One system registration. ``fd`` is the client's object, opened at register time and kept
    open so that every check fstats the very object that was registered. The frontend never
    maps it (no SIGBUS surface here); workers open it by ``object_name`` and map it only if it
    is ``identity``."""

    kind: ClassVar[str] = "system"
    name: str
    key: str  # as the client gave it (status shows it)
    object_name: str  # "/<name in /dev/shm>", what TensorRef / OutputTarget carry
    offset: int
    byte_size: int
    fd: int
    # the object's (st_dev, st_ino) from ``fd``: every use checks that the key still names it,
    # and workers map only this object (TensorRef.object_dev / object_id)
    identity: ObjectIdentity
    path: str  # the object's file in the shm directory (re-checked by name at every use)
    users: set[int] = field(default_factory=set)  # request ids using it now
    unregistered: bool = False


@dataclass(eq=False)
class CudaRegion:
    """One CUDA registration: nothing is held here; workers open ``handle`` themselves and keep
    it mapped until told to forget it."""

    kind: ClassVar[str] = "CUDA"
    name: str
    handle: CudaHandle
    users: set[int] = field(default_factory=set)  # request ids using it now
    unregistered: bool = False

    @property
    def byte_size(self) -> int:
        return self.handle.byte_size


Registration = SystemRegion | CudaRegion
