"""The sequence control inputs a backend feeds its model, as Triton's backends take them.

A model with ``sequence_batching.control_input`` gets one more input per declared control (START,
END, READY, CORRID, in that order here; backends that feed by name ignore the order): the
broker's sequence batcher makes the tensors (``broker/schedulers/sequence/controls.py``) with the
config's data type (INT32 / FP32 / BOOL for START / END / READY; UINT64 / INT64 / UINT32 / INT32 /
BYTES for CORRID), and the worker adds each request's row to that request's inputs under the
control's name, shaped ``[1, 1]`` when the model batches and ``[1]`` when it does not. So a
control is one more graph input of dims ``[1]`` (without the batch dim), which Triton's backends
count when they check the config's inputs against the model's.

Pure: parses the config with the broker's own parser (``SequenceBatcherConfig``), so the
controls are exactly the ones the batcher fills.
"""

from __future__ import annotations

from typing import Any, Final

from shoal.broker.schedulers.sequence.config import SequenceBatcherConfig
from shoal.workers.backends.torchscript_io import IoSpec

# the dims of every control tensor without the batch dim
CONTROL_DIMS: Final = (1,)


def control_inputs(config: Any) -> list[IoSpec]:
    """The declared control inputs of ``config`` (a ModelConfig) in START, END, READY, CORRID
    order, with their wire data types and dims ``[1]``; none without sequence batching."""
    if not config.HasField("sequence_batching"):
        return []
    controls = SequenceBatcherConfig.from_model_config(config).controls
    return [IoSpec(control.name, control.data_type, CONTROL_DIMS, None)
            for control in (controls.start, controls.end, controls.ready, controls.corrid)
            if control is not None]
