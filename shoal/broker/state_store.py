"""The bytes of implicit sequence state (``sequence_batching.state``), in broker-owned shm.

The sequence batcher's ``StateTracker`` decides which of a sequence's two buffers is the input
and which the output of each execution; this store owns those buffers. Each sequence incarnation
(``serial``) gets, per configured state, two slots (one for ``use_same_buffer_for_input_output``)
in an Arena of the broker, so a worker that dies loses no state: the restarted worker maps the
same bytes. Workers only read the input slot and write the output slot named in the Batch.

Capacity: a state with fixed dims gets exactly its size. A state with variable dims, or of
type BYTES, gets ``max(initial size, shoal_state_buffer_bytes)`` (model parameter, default
1 MiB); an execution whose output state does not fit fails with an error naming the parameter.

Lifetime: ``release`` frees a serial's slots once no execution that uses them is in flight
(``acquire``/``finish`` count those), so a sequence ended while its last request runs never has
its memory reused under that request. Single-threaded: the broker loop.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shoal.broker.schedulers.sequence.state import StateAssignment
from shoal.config.sequence_batching import SequenceBatcherConfig, StateSpec
from shoal.dtypes import element_count, element_size
from shoal.errors import invalid_arg
from shoal.messages import StateBinding, WrittenState
from shoal.shm.arena import Arena, Slot

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

logger = logging.getLogger(__name__)

STATE_BUFFER_PARAMETER = "shoal_state_buffer_bytes"
DEFAULT_STATE_BUFFER_BYTES = 1 << 20
_BYTES_LENGTH_PREFIX = 4  # dtypes.serialize_bytes: each element is a 4-byte length + its bytes


@dataclass(frozen=True, slots=True)
class StateLayout:
    """How one state's buffers are sized and first filled."""

    spec: StateSpec
    capacity: int
    initial_shape: tuple[int, ...]
    initial_bytes: bytes  # the first input state, exactly (zeros, or the initial_state file)
    declared_shape: tuple[int, ...]  # the state's dims, with the batch dim when batching


@dataclass(slots=True)
class _StateSlots:
    buffers: tuple[Slot, ...]  # index = the tracker's buffer number
    shape: tuple[int, ...]  # shape of the state in the current input buffer
    nbytes: int


@dataclass(slots=True)
class _SerialEntry:
    states: dict[str, _StateSlots]  # input name -> slots
    in_use: int = 0  # executions in flight that bind these slots
    released: bool = False


@dataclass
class SequenceStateStore:
    """serial -> its state slots. See the module docstring for the contract."""

    layouts: tuple[StateLayout, ...]
    arena: Arena
    _entries: dict[int, _SerialEntry] = field(default_factory=dict)
    _by_input: dict[str, StateLayout] = field(init=False)
    _input_of_output: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self._by_input = {layout.spec.input_name: layout for layout in self.layouts}
        self._input_of_output = {layout.spec.output_name: layout.spec.input_name
                                 for layout in self.layouts}

    def __len__(self) -> int:
        return len(self._entries)

    def bindings(self, assignment: StateAssignment) -> list[StateBinding]:
        """The StateBindings of one row, counting the execution as in flight (``finish`` ends
        it). A serial met for the first time (``assignment.initialize``) gets fresh slots with
        the initial state in buffer 0. Raises ShoalError(UNAVAILABLE) when shm is exhausted."""
        entry = self._entries.get(assignment.serial)
        if entry is None or assignment.initialize:
            if entry is not None:
                self._free(entry)
            entry = self._allocate()
            self._entries[assignment.serial] = entry
        entry.in_use += 1
        bindings = []
        for buffers in assignment.buffers:
            slots = entry.states[buffers.input_name]
            layout = self._by_input[buffers.input_name]
            source, target = slots.buffers[buffers.input_buffer], slots.buffers[
                buffers.output_buffer]
            bindings.append(StateBinding(
                input_name=buffers.input_name, output_name=buffers.output_name,
                datatype=layout.spec.data_type, dims=list(layout.declared_shape),
                shape=list(slots.shape),
                input_region=source.region, input_offset=source.offset, input_nbytes=slots.nbytes,
                output_region=target.region, output_offset=target.offset,
                capacity=layout.capacity))
        return bindings

    def written(self, serial: int, states: Sequence[WrittenState]) -> None:
        """The execution of ``serial`` wrote these output states: they are the next input
        states (the tracker swaps the buffers). Unknown names are ignored."""
        entry = self._entries.get(serial)
        if entry is None:
            return
        for state in states:
            input_name = self._input_of_output.get(state.output_name)
            if input_name is None:
                continue
            slots = entry.states[input_name]
            slots.shape, slots.nbytes = tuple(state.shape), state.nbytes

    def finish(self, serials: Sequence[int]) -> None:
        """An execution that bound these serials (one entry per row) ended, however it ended."""
        for serial in serials:
            entry = self._entries.get(serial)
            if entry is None:
                continue
            entry.in_use = max(0, entry.in_use - 1)
            if entry.released and entry.in_use == 0:
                self._drop(serial)

    def release(self, serial: int) -> None:
        """``serial`` ended: free its slots now, or when its last execution finishes."""
        entry = self._entries.get(serial)
        if entry is None:
            return
        entry.released = True
        if entry.in_use == 0:
            self._drop(serial)

    def release_all(self) -> None:
        """Every sequence ended (unload, no instance left): release every serial."""
        for serial in list(self._entries):
            self.release(serial)

    def close(self) -> None:
        """Unlink every segment (broker exit). Idempotent."""
        self._entries.clear()
        self.arena.close()

    def _allocate(self) -> _SerialEntry:
        states: dict[str, _StateSlots] = {}
        try:
            for layout in self.layouts:
                count = 1 if layout.spec.single_buffer else 2
                buffers = tuple(self.arena.allocate(layout.capacity) for _ in range(count))
                states[layout.spec.input_name] = _StateSlots(buffers, layout.initial_shape,
                                                             len(layout.initial_bytes))
                first = buffers[0].view
                first[:len(layout.initial_bytes)] = layout.initial_bytes
        except Exception:
            self._free(_SerialEntry(states))
            raise
        return _SerialEntry(states)

    def _drop(self, serial: int) -> None:
        entry = self._entries.pop(serial, None)
        if entry is not None:
            self._free(entry)

    def _free(self, entry: _SerialEntry) -> None:
        for slots in entry.states.values():
            for slot in slots.buffers:
                self.arena.free(slot)
        entry.states.clear()


def state_layouts(specs: Sequence[StateSpec], model_dir: str, model_name: str,
                  buffer_bytes: int) -> tuple[StateLayout, ...]:
    """Size every state and read its initial data (files under ``<model_dir>/initial_state``);
    raises ShoalError(INVALID_ARG) with Triton's message for a file that is too short."""
    layouts = []
    for spec in specs:
        initial_shape, initial = _initial_state(spec, model_dir, model_name)
        fixed = spec.data_type != "BYTES" and all(d >= 0 for d in spec.dims)
        capacity = len(initial) if fixed else max(len(initial), buffer_bytes)
        batch_dims = spec.default_shape[:len(spec.default_shape) - len(spec.dims)]
        layouts.append(StateLayout(spec, max(capacity, 1), initial_shape, initial,
                                   batch_dims + spec.dims))
    return tuple(layouts)


def _initial_state(spec: StateSpec, model_dir: str, model_name: str
                   ) -> tuple[tuple[int, ...], bytes]:
    initial = spec.initial
    if initial is None or initial.zero_data:
        shape = spec.default_shape if initial is None else initial.shape
        if spec.data_type == "BYTES":  # empty strings
            return shape, bytes(_BYTES_LENGTH_PREFIX * element_count(shape))
        return shape, bytes(element_count(shape) * element_size(spec.data_type))
    path = os.path.join(model_dir, initial.relative_path)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise invalid_arg(f"failed to read initial_state data_file '{initial.data_file}' of "
                          f"state '{spec.input_name}' of model '{model_name}': "
                          f"{exc.strerror}") from exc
    expected = initial.nbytes
    if expected is not None:
        if len(data) < expected:
            raise invalid_arg(f"initial_state setting expects {expected} bytes, but the data "
                              f"provided from {initial.data_file} only has {len(data)} bytes")
        data = data[:expected]
    return initial.shape, data


def parse_buffer_bytes(value: str, model_name: str) -> int:
    """The ``shoal_state_buffer_bytes`` model parameter: a positive integer."""
    try:
        parsed = int(value)
    except ValueError:
        parsed = 0
    if parsed <= 0:
        raise invalid_arg(f"model '{model_name}': parameter '{STATE_BUFFER_PARAMETER}' must be a "
                          f"positive number of bytes, got '{value}'")
    return parsed


def store_factory(model_config: ModelConfig, model_dir: str, prefix: str, segment_bytes: int,
                  max_bytes: int) -> Callable[[SequenceBatcherConfig], SequenceStateStore]:
    """What SequenceScheduling calls for a model with implicit state: the store, its arena's
    segments named ``f"{prefix}{n}"`` (``prefix`` unique per model version)."""

    def create(config: SequenceBatcherConfig) -> SequenceStateStore:
        buffer_bytes = DEFAULT_STATE_BUFFER_BYTES
        if STATE_BUFFER_PARAMETER in model_config.parameters:
            buffer_bytes = parse_buffer_bytes(
                model_config.parameters[STATE_BUFFER_PARAMETER].string_value, config.model_name)
        layouts = state_layouts(config.states, model_dir, config.model_name, buffer_bytes)
        return SequenceStateStore(layouts, Arena(prefix, segment_bytes, max_bytes))

    return create
