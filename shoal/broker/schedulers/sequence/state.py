"""Implicit state bookkeeping (Triton ``SequenceStates``), without the data.

Each sequence incarnation (a START begins one) has a ``serial``. For every configured state it
owns two buffers, 0 and 1, in the worker of the instance its sequence is pinned to (one buffer
for a ``use_same_buffer_for_input_output`` state). The model reads the input state from the
current input buffer and writes the output state into the other one; after the execution the
two swap, so the output becomes the next input. A state whose output the model did not write
keeps its input (Triton swaps only on an output-state update).

Contract with the worker, per executed row that has a StateAssignment:
  * ``initialize``: before executing, fill the input buffer from the state's StateSpec:
    ``initial`` (zeros, or the initial_state file), else zeros of ``default_shape``;
  * bind input ``input_name`` to buffer ``input_buffer`` and output ``output_name`` to
    ``output_buffer``;
  * a serial listed as released frees both buffers (after the executions sent before).
Rows without an assignment (direct-strategy not-ready rows) get zero-filled dummy states shaped
like the batch's other rows, so the real states are never touched.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from shoal.config.sequence_batching import StateSpec


@dataclass(frozen=True, slots=True)
class StateBuffers:
    input_name: str
    output_name: str
    input_buffer: int
    output_buffer: int


@dataclass(frozen=True, slots=True)
class StateAssignment:
    """Which buffers one row of an execution uses; see the module docstring."""

    serial: int
    initialize: bool
    buffers: tuple[StateBuffers, ...]


class StateTracker:
    """serial -> the current input buffer of each state. Not thread-safe."""

    def __init__(self, specs: Sequence[StateSpec]) -> None:
        self._specs = tuple(specs)
        self._current: dict[int, dict[str, int]] = {}

    def __bool__(self) -> bool:
        """The model has implicit state at all."""
        return bool(self._specs)

    def __contains__(self, serial: object) -> bool:
        return serial in self._current

    def __len__(self) -> int:
        return len(self._current)

    def begin(self, serial: int) -> StateAssignment:
        """A new incarnation: its states start in buffer 0, to be initialized."""
        self._current[serial] = {spec.input_name: 0 for spec in self._specs}
        return self.assignment(serial, initialize=True)

    def assignment(self, serial: int, *, initialize: bool = False) -> StateAssignment:
        current = self._current[serial]
        buffers = []
        for spec in self._specs:
            input_buffer = current[spec.input_name]
            output_buffer = input_buffer if spec.single_buffer else 1 - input_buffer
            buffers.append(StateBuffers(spec.input_name, spec.output_name, input_buffer,
                                        output_buffer))
        return StateAssignment(serial, initialize, tuple(buffers))

    def swap(self, serial: int, unwritten_outputs: Collection[str] = ()) -> None:
        """After an execution of ``serial``: every written two-buffer state swaps. Unknown
        serials (released meanwhile) are ignored."""
        current = self._current.get(serial)
        if current is None:
            return
        for spec in self._specs:
            if not spec.single_buffer and spec.output_name not in unwritten_outputs:
                current[spec.input_name] = 1 - current[spec.input_name]

    def release(self, serial: int) -> bool:
        """Forget ``serial``; False when it was not tracked."""
        return self._current.pop(serial, None) is not None

    def clear(self) -> None:
        self._current.clear()
