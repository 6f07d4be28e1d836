"""The ``shared_memory_*`` parameters of a tensor (system and CUDA shared-memory extensions),
shared by the HTTP and gRPC decoders: the slice a tensor names, parsed but not yet checked
against the registry (``shm_registry`` does that).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from shoal.errors import invalid_arg

INT64_MAX: Final = (1 << 63) - 1
SHM_REGION: Final = "shared_memory_region"
SHM_OFFSET: Final = "shared_memory_offset"
SHM_BYTE_SIZE: Final = "shared_memory_byte_size"
SHM_KEYS: Final = (SHM_REGION, SHM_OFFSET, SHM_BYTE_SIZE)


@dataclass(frozen=True, slots=True)
class SharedMemorySlice:
    """A tensor's place in a client-registered region (system or CUDA)."""

    region: str
    offset: int
    byte_size: int


def decode_shared_memory(params: dict[str, Any], tensor: str) -> SharedMemorySlice | None:
    """The ``shared_memory_*`` parameters of one tensor (``tensor`` is e.g. "input 'X'"), or
    None when it has none. Region and byte size come together; the offset is optional (0)."""
    if not any(key in params for key in SHM_KEYS):
        return None
    region = params.get(SHM_REGION)
    if SHM_REGION not in params or SHM_BYTE_SIZE not in params:
        raise invalid_arg(
            f"{tensor} must set both 'shared_memory_region' and 'shared_memory_byte_size' in "
            "'parameters' to use shared memory ('shared_memory_offset' is optional)"
        )
    if not isinstance(region, str):
        raise invalid_arg(f"Unable to parse 'shared_memory_region' for {tensor}: expected a "
                          "string")
    values = []
    for key in (SHM_BYTE_SIZE, SHM_OFFSET):
        value = params.get(key, 0)
        if type(value) is not int or not 0 <= value <= INT64_MAX:
            raise invalid_arg(f"Unable to parse '{key}' for {tensor}: expected an integer "
                              f"in [0, {INT64_MAX}]")
        values.append(value)
    return SharedMemorySlice(region, offset=values[1], byte_size=values[0])


def check_output_shm(name: str, shm: SharedMemorySlice | None, classification: int) -> None:
    """Output ``name``, written to shared memory (``shm``), cannot also be classified (HTTP
    and gRPC)."""
    if shm is not None and classification:
        raise invalid_arg(f"Output '{name}' can't set both 'shared_memory_region' and "
                          "'classification'")
