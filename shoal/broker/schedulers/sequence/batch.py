"""What the sequence batcher hands the broker: executions, and notices that are not executions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from shoal.broker.schedulers.base import Rejection
from shoal.broker.schedulers.sequence.controls import RowControl, build_control_tensors
from shoal.broker.schedulers.sequence.requests import CorrelationId, SequenceRequest
from shoal.broker.schedulers.sequence.state import StateAssignment
from shoal.config.sequence_batching import ControlInputs


@dataclass(frozen=True, slots=True)
class BatchRow:
    """One row of an execution. ``request`` None: a not-ready row (direct strategy: a slot
    below the highest ready slot that has nothing to run now); its inputs are zeros shaped like
    ``SequenceBatch.filler``'s and its outputs are discarded. ``slot``: the sequence slot the
    row belongs to (direct: equal to the row index)."""

    slot: int
    request: SequenceRequest | None
    control: RowControl
    state: StateAssignment | None = None


@dataclass(frozen=True, slots=True)
class SequenceBatch:
    """One execution on instance ``instance``, rows in batch order.

    ``filler``: the request whose input shapes the not-ready rows copy (None when every row has
    a request). ``released_states``: state serials the worker frees after this execution
    (sequences that ended in it, or whose slot a new sequence took)."""

    instance: int
    rows: tuple[BatchRow, ...]
    filler: SequenceRequest | None = None
    released_states: tuple[int, ...] = ()

    @property
    def requests(self) -> list[SequenceRequest]:
        """The requests of the ready rows, in row order."""
        return [row.request for row in self.rows if row.request is not None]

    def control_tensors(
        self, controls: ControlInputs, batching: bool
    ) -> dict[str, npt.NDArray[np.generic]]:
        """The control inputs of this execution (see ``controls.build_control_tensors``)."""
        return build_control_tensors(controls, [row.control for row in self.rows], batching)


ReleaseReason = Literal["idle", "cancelled", "instance_failed"]


@dataclass(frozen=True, slots=True)
class SequenceReleased:
    """A live sequence ended without an END request. Later requests on its id without START are
    rejected. ``instance``: where its slot was (None: it was in the backlog). ``state_serial``:
    state the worker of ``instance`` frees, after the executions already sent to it (None:
    nothing to free now)."""

    correlation_id: CorrelationId
    instance: int | None
    reason: ReleaseReason
    state_serial: int | None = None


@dataclass(frozen=True, slots=True)
class SequenceConflict:
    """A START arrived for an id whose sequence had not ended; the earlier sequence ends before
    the new one starts (its queued requests still run). ``message`` is Triton's warning text,
    for the broker's log."""

    correlation_id: CorrelationId
    message: str


Notice = Rejection | SequenceReleased | SequenceConflict
