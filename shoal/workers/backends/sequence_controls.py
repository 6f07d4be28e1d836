"""The sequence control inputs a backend feeds its model, as Triton's backends take them.

A model with ``sequence_batching.control_input`` gets one more input per declared control (START,
END, READY, CORRID, in that order here; backends that feed by name ignore the order): the
broker's sequence batcher makes the tensors (``broker/schedulers/sequence/controls.py``) with the
config's data type (INT32 / FP32 / BOOL for START / END / READY; UINT64 / INT64 / UINT32 / INT32 /
BYTES for CORRID), and the worker adds each request's row to that request's inputs under the
control's name, shaped ``[1, 1]`` when the model batches and ``[1]`` when it does not. So a
control is one more graph input of dims ``[1]`` (without the batch dim), which Triton's backends
count when they check the config's inputs against the model's.

``check_control`` is the one load-time check of a control against the model's input of its
name (present; batch dim -1 when the model batches; dims exactly ``[1]`` without it; the
control's data type), worded as Triton's onnxruntime or tensorflow backend words it.

Pure: parses the config with the broker's own parser (``SequenceBatcherConfig``), so the
controls are exactly the ones the batcher fills.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from shoal.config.sequence_batching import SequenceBatcherConfig
from shoal.errors import invalid_arg
from shoal.workers.backends.torchscript_io import IoSpec

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

# the dims of every control tensor without the batch dim
CONTROL_DIMS: Final = (1,)

# whose messages check_control gives: Triton's onnxruntime backend or its tensorflow backend
Wording = Literal["onnxruntime", "tensorflow"]


def control_inputs(config: ModelConfig) -> list[IoSpec]:
    """The declared control inputs of ``config`` (a ModelConfig) in START, END, READY, CORRID
    order, with their wire data types and dims ``[1]``; none without sequence batching."""
    if not config.HasField("sequence_batching"):
        return []
    return batcher_controls(SequenceBatcherConfig.from_model_config(config))


def batcher_controls(batcher: SequenceBatcherConfig) -> list[IoSpec]:
    """``control_inputs`` of an already parsed sequence batcher config."""
    controls = batcher.controls
    return [IoSpec(control.name, control.data_type, CONTROL_DIMS, None)
            for control in (controls.start, controls.end, controls.ready, controls.corrid)
            if control is not None]


@dataclass(frozen=True)
class ModelInput:
    """The model's input of a control's name as a backend reads it: its dims with the batch dim
    (-1 for a dynamic dim; None when unknown, then not checked) and its wire data type ("" when
    Triton has none for it; None when not checked, as where the backend converts)."""

    dims: tuple[int, ...] | None
    datatype: str | None


def check_control(model: str, control: IoSpec, found: ModelInput | None, batching: bool,
                  wording: Wording) -> None:
    """INVALID_ARG unless ``found`` (the model's input named ``control.name``, None when it has
    none) takes what the sequence batcher feeds for ``control``: dims ``[-1, 1]`` when the model
    batches, ``[1]`` when it does not, of the control's data type."""
    name = control.name
    if found is None:
        raise invalid_arg(f"configuration specified sequence control '{name}', but model "
                          "does not provide that input")
    prefix = f"unable to load model '{model}', sequence control '{name}'"
    if found.dims is not None:
        shape = list(found.dims)
        if batching and (not shape or shape[0] != -1):
            text = (f"model '{model}', tensor '{name}': for the model to support batching the "
                    "shape should have at least 1 dimension and the first dimension must be "
                    f"-1; but shape expected by the model is {shape}")
            raise invalid_arg(f"{prefix}: {text}" if wording == "tensorflow" else text)
        unbatched = shape[1:] if batching else shape
        if unbatched != list(CONTROL_DIMS):
            if wording == "tensorflow":
                full = [-1, *CONTROL_DIMS] if batching else list(CONTROL_DIMS)
                raise invalid_arg(f"{prefix}: model '{model}', tensor '{name}': the model "
                                  f"expects {len(shape)} dimensions (shape {shape}) but the "
                                  f"model configuration specifies {len(full)} dimensions "
                                  f"(shape {full})")
            raise invalid_arg(f"{prefix} in model has dims {unbatched} but dims "
                              f"{list(CONTROL_DIMS)} is expected")
    if found.datatype is not None and found.datatype != control.datatype:
        if wording == "tensorflow":
            raise invalid_arg(f"{prefix}: the model expects {_type_name(found.datatype, wording)}"
                              " but the model configuration specifies data-type "
                              f"{_type_name(control.datatype, wording)}")
        raise invalid_arg(f"{prefix}, the model expects data-type "
                          f"{_type_name(found.datatype, wording)} but the model configuration "
                          f"specifies data-type {_type_name(control.datatype, wording)}")


def _type_name(wire: str, wording: Wording) -> str:
    """The config ``data_type`` name of ``wire`` in the messages (of a model type Triton has
    no name for: onnxruntime's TYPE_INVALID, else said in words)."""
    if not wire:
        return "TYPE_INVALID" if wording == "onnxruntime" else "a type Triton has none for"
    return "TYPE_STRING" if wire == "BYTES" else f"TYPE_{wire}"
