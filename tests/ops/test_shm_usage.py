"""Shared-memory use per owning process, from segment files named as the server names them
(real files in a temporary directory standing in for /dev/shm)."""

from __future__ import annotations

import os
import pathlib

from shoal.ops.shm_usage import Owner, attribute_segments, scan_segments, worker_serial_prefix

ID = "0123456789ab"


def segment(directory: pathlib.Path, name: str, size: int, written: int = 0) -> None:
    with open(directory / name, "wb") as f:
        f.truncate(size)
        if written:
            f.write(b"x" * written)


def test_segments_are_summed_per_owner_and_kind(tmp_path: pathlib.Path) -> None:
    segment(tmp_path, f"shoal-{ID}-fe4321-0", 1 << 20, written=8192)
    segment(tmp_path, f"shoal-{ID}-fe4321-1", 1 << 20)
    segment(tmp_path, f"shoal-{ID}-w7-0", 2 << 20)
    segment(tmp_path, f"shoal-{ID}-w7-b0", 1 << 20)
    segment(tmp_path, f"shoal-{ID}-st3-0", 4096)
    segment(tmp_path, f"shoal-{ID}-w99-0", 4096)  # a worker that already exited
    segment(tmp_path, f"shoal-{ID}.lock", 0)  # the instance lock: not a segment
    segment(tmp_path, "shoal-ffffffffffff-fe1-0", 4096)  # another server's
    segment(tmp_path, "client-region", 4096)  # a client's object
    segments = scan_segments(ID, str(tmp_path))
    assert len(segments) == 6
    owners = attribute_segments(
        segments, ID, frontends={4321: Owner("frontend 0", 4321)},
        workers={worker_serial_prefix(f"/shoal-{ID}-w7-", ID): Owner("worker m", 55)},
        broker=Owner("broker", 9))
    table = {(o.owner, o.kind): (o.segments, o.bytes, o.pid) for o in owners}
    assert table == {
        ("frontend 0", "frontend input arena"): (2, 2 << 20, 4321),
        ("worker m", "worker output arena"): (1, 2 << 20, 55),
        ("worker m", "worker BLS arena"): (1, 1 << 20, 55),
        ("broker", "broker sequence state"): (1, 4096, 9),
        ("unknown", "worker output arena"): (1, 4096, None),
    }
    front = next(o for o in owners if o.owner == "frontend 0")
    assert 8192 <= front.resident_bytes < 2 << 20  # sparse: only the written pages


def test_missing_directory_is_empty() -> None:
    assert scan_segments(ID, "/nonexistent-shm-dir") == []


def test_worker_serial_prefix_of_another_instance_is_empty() -> None:
    assert worker_serial_prefix(f"/shoal-{ID}-w12-", ID) == "w12-"
    assert worker_serial_prefix("/shoal-ffffffffffff-w12-", ID) == ""
    assert os.sep not in worker_serial_prefix(f"/shoal-{ID}-w12-", ID)
