"""SequenceStateStore: sizing, initial data, bindings that follow the tracker's buffers, and
slots freed only when no execution in flight uses them (real POSIX shm, test-prefixed)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import numpy as np
import pytest

from shoal.broker.schedulers.sequence.state import StateTracker
from shoal.broker.state_store import (
    SequenceStateStore,
    parse_buffer_bytes,
    state_layouts,
)
from shoal.config.sequence_batching import InitialStateSpec, StateSpec
from shoal.errors import ShoalError
from shoal.messages import WrittenState
from shoal.shm.arena import Arena
from shoal.shm.segment import Segment

FIXED = StateSpec("IN", "OUT", "INT64", (2,), (1, 2))
GROWING = StateSpec("H_IN", "H_OUT", "FP32", (-1,), (1, 1))


@pytest.fixture
def arena(shm_prefix: str) -> Iterator[Arena]:
    created = Arena(shm_prefix + "st0-", 64 * 1024, 256 * 1024)
    yield created
    created.close()


def _read(region: str, offset: int, nbytes: int) -> bytes:
    segment = Segment.attach(region, readonly=True)
    try:
        return bytes(segment.buf[offset:offset + nbytes])
    finally:
        segment.close()


def test_fixed_state_gets_its_exact_size_and_variable_one_the_parameter(tmp_path: pathlib.Path
                                                                        ) -> None:
    fixed, growing = state_layouts([FIXED, GROWING], str(tmp_path), "m", buffer_bytes=4096)
    assert fixed.capacity == 16 and fixed.initial_bytes == bytes(16)
    assert fixed.declared_shape == (1, 2)
    assert growing.capacity == 4096 and growing.initial_shape == (1, 1)
    assert growing.initial_bytes == bytes(4) and growing.declared_shape == (1, -1)


def test_initial_state_file_is_read_and_checked(tmp_path: pathlib.Path) -> None:
    spec = StateSpec("IN", "OUT", "INT64", (2,), (1, 2), InitialStateSpec(
        "seed", "INT64", (1, 2), zero_data=False, data_file="seed.bin"))
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "seed.bin").write_bytes(np.array([7, 8], np.int64).tobytes())
    (layout,) = state_layouts([spec], str(tmp_path), "m", 1024)
    assert np.frombuffer(layout.initial_bytes, np.int64).tolist() == [7, 8]
    (tmp_path / "initial_state" / "seed.bin").write_bytes(b"\0" * 8)
    with pytest.raises(ShoalError, match=r"expects 16 bytes, but the data provided from "
                                         r"seed\.bin only has 8 bytes"):
        state_layouts([spec], str(tmp_path), "m", 1024)
    (tmp_path / "initial_state" / "seed.bin").unlink()
    with pytest.raises(ShoalError, match=r"failed to read initial_state data_file 'seed\.bin'"):
        state_layouts([spec], str(tmp_path), "m", 1024)


def test_bindings_follow_the_tracker_and_written_shapes(arena: Arena, tmp_path: pathlib.Path
                                                        ) -> None:
    seeded = StateSpec("IN", "OUT", "INT64", (2,), (1, 2), InitialStateSpec(
        "seed", "INT64", (1, 2), zero_data=False, data_file="s.bin"))
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "s.bin").write_bytes(np.array([5, 6], np.int64).tobytes())
    store = SequenceStateStore(state_layouts([seeded, GROWING], str(tmp_path), "m", 1024), arena)
    tracker = StateTracker([seeded, GROWING])
    first = store.bindings(tracker.begin(1))
    fixed, growing = first
    assert (fixed.input_name, fixed.output_name, fixed.shape) == ("IN", "OUT", [1, 2])
    assert np.frombuffer(_read(fixed.input_region, fixed.input_offset, fixed.input_nbytes),
                         np.int64).tolist() == [5, 6]
    assert (fixed.input_region, fixed.input_offset) != (fixed.output_region, fixed.output_offset)
    assert growing.capacity == 1024 and growing.shape == [1, 1] and growing.input_nbytes == 4
    store.written(1, [WrittenState("H_OUT", [1, 3], 12)])  # only the growing state written
    tracker.swap(1, unwritten_outputs={"OUT"})
    store.finish([1])
    fixed2, growing2 = store.bindings(tracker.assignment(1))
    assert (fixed2.input_offset, fixed2.output_offset) == (fixed.input_offset,
                                                           fixed.output_offset)
    assert (growing2.input_offset, growing2.output_offset) == (growing.output_offset,
                                                               growing.input_offset)
    assert growing2.shape == [1, 3] and growing2.input_nbytes == 12
    store.finish([1])


def test_release_waits_for_the_execution_in_flight(arena: Arena, tmp_path: pathlib.Path) -> None:
    store = SequenceStateStore(state_layouts([FIXED], str(tmp_path), "m", 64), arena)
    tracker = StateTracker([FIXED])
    store.bindings(tracker.begin(1))
    used = arena.used_bytes
    assert used > 0 and len(store) == 1
    store.release(1)  # its last request still runs: nothing freed yet
    assert arena.used_bytes == used and len(store) == 1
    store.finish([1])
    assert arena.used_bytes == 0 and len(store) == 0
    store.bindings(tracker.begin(2))
    store.finish([2])
    store.release(2)  # idle: freed at once
    assert arena.used_bytes == 0


def test_single_buffer_state_reads_and_writes_one_slot(arena: Arena, tmp_path: pathlib.Path
                                                       ) -> None:
    single = StateSpec("IN", "OUT", "INT64", (2,), (1, 2), single_buffer=True)
    store = SequenceStateStore(state_layouts([single], str(tmp_path), "m", 64), arena)
    (binding,) = store.bindings(StateTracker([single]).begin(3))
    assert (binding.input_region, binding.input_offset) == (binding.output_region,
                                                            binding.output_offset)
    assert arena.used_bytes == 64


def test_buffer_parameter_must_be_a_positive_integer() -> None:
    assert parse_buffer_bytes("4096", "m") == 4096
    for bad in ("0", "-3", "lots"):
        with pytest.raises(ShoalError, match="shoal_state_buffer_bytes"):
            parse_buffer_bytes(bad, "m")


def test_release_all_frees_idle_serials_and_defers_busy_ones(arena: Arena,
                                                             tmp_path: pathlib.Path) -> None:
    store = SequenceStateStore(state_layouts([FIXED], str(tmp_path), "m", 64), arena)
    tracker = StateTracker([FIXED])
    store.bindings(tracker.begin(1))
    store.bindings(tracker.begin(2))
    store.finish([2])
    store.release_all()
    assert len(store) == 1  # serial 1 still has an execution in flight
    store.finish([1])
    assert len(store) == 0 and arena.used_bytes == 0
