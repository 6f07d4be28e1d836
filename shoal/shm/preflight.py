"""Start-up check that /dev/shm can hold the arenas (docs/architecture.md §4), with the fix in the
message.

Containers often get a 64 MiB /dev/shm by default (docker); running out later would fail
requests or, for a writer touching an unreserved page, kill the process with SIGBUS.
"""

from __future__ import annotations

import os

_GIB = 1 << 30
_MIB = 1 << 20


class ShmTooSmall(Exception):
    """/dev/shm cannot hold what the configuration needs. The message says what to change."""


def check_shm_capacity(required_bytes: int, shm_dir: str = "/dev/shm") -> None:
    """Raise ShmTooSmall unless ``shm_dir`` has at least ``required_bytes`` free."""
    try:
        stats = os.statvfs(shm_dir)
    except OSError as exc:
        raise ShmTooSmall(
            f"{shm_dir} is not usable ({exc.strerror}); shoal needs a shared-memory filesystem "
            f"there with {_human(required_bytes)} free. {_how_to_fix(required_bytes)}"
        ) from exc
    free_bytes = stats.f_bavail * stats.f_frsize
    if required_bytes <= free_bytes:
        return
    total_bytes = stats.f_blocks * stats.f_frsize
    # the size /dev/shm would need so that what is used today plus shoal's need fits
    wanted_total = total_bytes - free_bytes + required_bytes
    raise ShmTooSmall(
        f"{shm_dir} has {_human(free_bytes)} free ({free_bytes} bytes of {_human(total_bytes)}) "
        f"but shoal needs {_human(required_bytes)} ({required_bytes} bytes) for its "
        f"shared-memory arenas. {_how_to_fix(wanted_total)}"
    )


def _how_to_fix(wanted_total: int) -> str:
    size_gib = max(1, -(-wanted_total // _GIB))
    return (
        f"To fix it, give the container more shared memory: docker run --shm-size={size_gib}g "
        f"(or --ipc=host); in Kubernetes mount an emptyDir volume with medium: Memory "
        f"(sizeLimit: {size_gib}Gi) at /dev/shm; or lower shoal's --shm-segment-byte-size "
        f"(and the arena limit) so the arenas fit."
    )


def _human(nbytes: int) -> str:
    if nbytes >= _GIB:
        return f"{nbytes / _GIB:.1f} GiB"
    return f"{nbytes / _MIB:.1f} MiB"
