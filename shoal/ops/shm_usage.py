"""The server's shared-memory segments in /dev/shm, summed per owning process.

Names (docs/architecture.md §4): ``shoal-<id>-fe<pid>-<n>`` a frontend's input arena,
``shoal-<id>-w<serial>-<n>`` a worker's output arena, ``shoal-<id>-w<serial>-b<n>`` its BLS
input arena, ``shoal-<id>-st<serial>-<n>`` the broker's sequence-state arenas. One ``scandir``
and one ``stat`` per segment: no segment is opened or mapped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from shoal.ops.schema import SegmentOwner

SHM_DIRECTORY = "/dev/shm"

_FRONTEND = re.compile(r"fe(\d+)-\d+$")
_WORKER = re.compile(r"(w\d+-)(b?)\d+$")
_STATE = re.compile(r"st\d+-\d+$")


@dataclass(frozen=True)
class Segment:
    name: str  # as in /dev/shm, without the leading slash
    bytes: int
    resident_bytes: int


def scan_segments(instance_id: str, shm_directory: str = SHM_DIRECTORY) -> list[Segment]:
    """Every segment of the instance (its lock file excluded); vanished ones are skipped."""
    prefix = f"shoal-{instance_id}-"
    segments: list[Segment] = []
    try:
        entries = os.scandir(shm_directory)
    except OSError:
        return segments
    with entries:
        for entry in entries:
            if not entry.name.startswith(prefix):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            segments.append(Segment(entry.name, info.st_size, info.st_blocks * 512))
    return segments


@dataclass(frozen=True)
class Owner:
    key: str  # the process key in the document's processes[]
    pid: int | None


def attribute_segments(segments: list[Segment], instance_id: str,
                       frontends: Mapping[int, Owner], workers: Mapping[str, Owner],
                       broker: Owner | None) -> list[SegmentOwner]:
    """Sum ``segments`` per (owner, kind). ``frontends``: by pid; ``workers``: by the serial
    part of their arena prefix (``w<serial>-``). A segment whose owner is not among them
    (a process that just exited, not yet cleaned up) counts under ``unknown``."""
    prefix = f"shoal-{instance_id}-"
    totals: dict[tuple[str, str], list[int]] = {}
    pids: dict[str, int | None] = {"unknown": None}
    for segment in segments:
        rest = segment.name[len(prefix):]
        owner: Owner | None = None
        kind = "unknown"
        if match := _FRONTEND.match(rest):
            owner, kind = frontends.get(int(match[1])), "frontend input arena"
        elif match := _WORKER.match(rest):
            owner = workers.get(match[1])
            kind = "worker BLS arena" if match[2] else "worker output arena"
        elif _STATE.match(rest):
            owner, kind = broker, "broker sequence state"
        key = owner.key if owner is not None else "unknown"
        if owner is not None:
            pids[key] = owner.pid
        total = totals.setdefault((key, kind), [0, 0, 0])
        total[0] += 1
        total[1] += segment.bytes
        total[2] += segment.resident_bytes
    return [SegmentOwner(owner=key, pid=pids.get(key), kind=kind, segments=count,
                         bytes=size, resident_bytes=resident)
            for (key, kind), (count, size, resident) in sorted(totals.items())]


def worker_serial_prefix(arena_prefix: str, instance_id: str) -> str:
    """``w<serial>-`` from a worker's arena prefix ``/shoal-<id>-w<serial>-`` ("" if it is not
    one of this instance's)."""
    head = f"/shoal-{instance_id}-"
    return arena_prefix[len(head):] if arena_prefix.startswith(head) else ""
