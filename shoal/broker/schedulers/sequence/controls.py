"""The sequence control tensors of one execution (Triton ``SequenceBatch::SetControlTensors``).

Every row of a batch gets one value per control the model declared. A request row gets START /
END from its flags and READY true; a not-ready row (a direct-strategy slot with nothing to run)
gets START, END and READY false and CORRID 0 (an empty string for a BYTES CORRID): the model must
not read its other inputs.

Shapes: Triton gives each request a [1] control input, so an execution of N rows sees [N, 1]
when the model batches (max_batch_size > 0) and [1] when it does not.

CORRID values: Triton copies the request's uint64 id into the control's element size, so UINT32
and INT32 keep the low 32 bits and INT64 reinterprets the bits (two's complement). A string id
given to an integer CORRID (Triton 2.51 accepts it) becomes what Triton writes there: the
string's BYTES element (4-byte little-endian length, then its UTF-8 bytes) cut to the control's
element size and read as that integer type. Triton leaves the bytes past a short string's end
as they were in its buffer and writes a long one past the element (heap corruption: a string of
100+ bytes for a UINT64 CORRID crashed tritonserver 2.51); shoal zero-fills the element and
writes nothing past it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from shoal.broker.schedulers.sequence.requests import (
    SEQUENCE_END,
    SEQUENCE_START,
    CorrelationId,
    SequenceRequest,
)
from shoal.config.sequence_batching import BoolControl, ControlInputs, CorridControl

_NUMPY_OF: Final = {
    "BOOL": np.dtype(np.bool_), "INT32": np.dtype("<i4"), "FP32": np.dtype("<f4"),
    "UINT64": np.dtype("<u8"), "INT64": np.dtype("<i8"), "UINT32": np.dtype("<u4"),
}
_INT_BITS: Final = {"UINT64": (64, False), "INT64": (64, True), "UINT32": (32, False),
                    "INT32": (32, True)}


@dataclass(frozen=True, slots=True)
class RowControl:
    """The control values of one row of an execution."""

    start: bool
    end: bool
    ready: bool
    correlation_id: CorrelationId

    @classmethod
    def for_request(cls, request: SequenceRequest) -> RowControl:
        return cls(
            start=bool(request.flags & SEQUENCE_START),
            end=bool(request.flags & SEQUENCE_END),
            ready=True,
            correlation_id=request.correlation_id,
        )

    @classmethod
    def not_ready(cls) -> RowControl:
        return cls(start=False, end=False, ready=False, correlation_id=0)


NOT_READY: Final = RowControl.not_ready()


def build_control_tensors(
    controls: ControlInputs, rows: Sequence[RowControl], batching: bool
) -> dict[str, npt.NDArray[np.generic]]:
    """Control input name -> array for one execution, rows in batch order. Shape [len(rows), 1]
    when ``batching``, else [1] (a non-batching model executes one row at a time)."""
    if not batching and len(rows) != 1:
        raise ValueError(f"a model without batching executes one row, got {len(rows)}")
    shape = (len(rows), 1) if batching else (1,)
    tensors: dict[str, npt.NDArray[np.generic]] = {}
    flags = ((controls.start, [r.start for r in rows]), (controls.end, [r.end for r in rows]),
             (controls.ready, [r.ready for r in rows]))
    for control, values in flags:
        if control is not None:
            tensors[control.name] = _flag_tensor(control, values, shape)
    if controls.corrid is not None:
        tensors[controls.corrid.name] = _corrid_tensor(controls.corrid, rows, shape)
    return tensors


def _flag_tensor(
    control: BoolControl, flags: list[bool], shape: tuple[int, ...]
) -> npt.NDArray[np.generic]:
    values = [control.true_value if flag else control.false_value for flag in flags]
    return np.array(values, dtype=_NUMPY_OF[control.data_type]).reshape(shape)


def _corrid_tensor(
    control: CorridControl, rows: Sequence[RowControl], shape: tuple[int, ...]
) -> npt.NDArray[np.generic]:
    if control.data_type == "BYTES":
        data = np.empty(len(rows), dtype=np.object_)
        for index, row in enumerate(rows):
            data[index] = corrid_bytes(row.correlation_id)
        return data.reshape(shape)
    values = [corrid_integer(control.data_type, row.correlation_id) for row in rows]
    return np.array(values, dtype=_NUMPY_OF[control.data_type]).reshape(shape)


def corrid_integer(data_type: str, correlation_id: CorrelationId) -> int:
    """The value an integer CORRID control carries for ``correlation_id``: an integer id's low
    bits, a string id's leading BYTES-element bytes (module docstring); 0 for a not-ready row."""
    bits, signed = _INT_BITS[data_type]
    if isinstance(correlation_id, str):
        encoded = correlation_id.encode()
        element = (len(encoded).to_bytes(4, "little") + encoded)[:bits // 8]
        value = int.from_bytes(element, "little")
    else:
        value = correlation_id & ((1 << bits) - 1)
    if signed and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def corrid_bytes(correlation_id: CorrelationId) -> bytes:
    """The BYTES CORRID element: the string id's UTF-8 bytes; empty for a not-ready row."""
    return correlation_id.encode() if isinstance(correlation_id, str) else b""
