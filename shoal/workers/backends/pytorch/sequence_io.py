"""The sequence tensors a ``pytorch``-backend model takes besides its config inputs and outputs,
as Triton's pytorch backend passes them (read with the broker's own parser,
``SequenceBatcherConfig``).

Extra ``forward()`` inputs, after the config inputs: the declared control inputs
(``sequence_batching.control_input``: START, END, READY, CORRID, in that order) and then the
input of every implicit state (``sequence_batching.state[].input_name``, in state order).
Extra outputs, after the config outputs: the output of every state
(``state[].output_name``) that is not also a config output.

Naming rule (the one Triton applies to every tensor): when every input name (config inputs,
controls and state inputs together) is a ``forward()`` argument name, tensors go by name; else
when every one is ``<name>__<index>``, the index is the argument position; else the order above.
Outputs likewise: ``<name>__<index>`` names (config and state outputs together) give the position
in the returned tuple, else config outputs then state outputs in order. So a TorchScript
accumulator ``forward(self, INPUT__0, SUM_IN__1) -> (OUTPUT__0, SUM_OUT__1)`` declares
``state [{ input_name: "SUM_IN__1" output_name: "SUM_OUT__1" ... }]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shoal.config.sequence_batching import SequenceBatcherConfig
from shoal.workers.backends.sequence_controls import batcher_controls
from shoal.workers.backends.torchscript_io import IoSpec

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


@dataclass(frozen=True)
class SequenceTensors:
    inputs: list[IoSpec]  # controls, then state inputs
    state_outputs: list[IoSpec]  # state outputs that are not config outputs


def sequence_tensors(config: ModelConfig) -> SequenceTensors:
    """The extra tensors of ``config`` (a ModelConfig); none without sequence batching."""
    if not config.HasField("sequence_batching"):
        return SequenceTensors([], [])
    batcher = SequenceBatcherConfig.from_model_config(config)
    inputs = batcher_controls(batcher)
    inputs += [IoSpec(state.input_name, state.data_type, state.dims, None)
               for state in batcher.states]
    config_outputs = {io.name for io in config.output}
    outputs = [IoSpec(state.output_name, state.data_type, state.dims, None)
               for state in batcher.states if state.output_name not in config_outputs]
    return SequenceTensors(inputs, outputs)
