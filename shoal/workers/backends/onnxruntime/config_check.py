"""The model config against the ONNX graph, at load, with the messages of Triton's onnxruntime
backend (ValidateInputs / ValidateOutputs / ValidateBooleanSequenceControl /
ValidateTypedSequenceControl): every config input (and ``batch_input`` target, sequence control
input and state input) must be a graph input of the same data type and a compatible shape (a
control: dims ``[1]`` without the batch dim, which is -1 when the model batches), every graph
input without a default must be fed, and every config output (and state output) must be a graph
output of the same data type and a compatible shape. Pure functions; raise INVALID_ARG.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shoal.dtypes import wire_to_config
from shoal.errors import invalid_arg
from shoal.workers.backends.onnxruntime.graph_io import GraphTensor, config_type_name
from shoal.workers.backends.sequence_controls import ModelInput, check_control
from shoal.workers.backends.torchscript_io import IoSpec


@dataclass(frozen=True)
class ConfigTensor:
    """A tensor the config feeds or reads: its name, wire data type and the dims the model sees
    (``reshape`` when given, else ``dims``; without the batch dim). ``dims`` is None when the
    shape is not checked (ragged inputs, batch inputs)."""

    name: str
    datatype: str
    dims: tuple[int, ...] | None


def check_controls(model: str, controls: Sequence[IoSpec], graph_inputs: Sequence[GraphTensor],
                   optional_inputs: Sequence[GraphTensor], batching: bool) -> None:
    """Each sequence control input (``sequence_batching.control_input``, with the data type its
    control gives it) must be a graph input of that data type and of dims ``[1]`` without the
    batch dim (the shape the sequence batcher feeds; ``sequence_controls.check_control``)."""
    graph = {t.name: t for t in [*graph_inputs, *optional_inputs]}
    for control in controls:
        found = graph.get(control.name)
        check_control(model, control,
                      None if found is None else ModelInput(found.dims, found.datatype),
                      batching, "onnxruntime")


def check_inputs(model: str, config_inputs: Sequence[ConfigTensor],
                 graph_inputs: Sequence[GraphTensor], optional_inputs: Sequence[GraphTensor],
                 batching: bool, generated: Sequence[str] = ()) -> None:
    """``optional_inputs`` are the graph's overridable initializers (inputs with a default);
    ``generated`` names the inputs the backend makes (ragged batching's ``batch_input`` targets
    and padding mask, the sequence control inputs), which must be graph inputs too."""
    graph = {t.name: t for t in [*graph_inputs, *optional_inputs]}
    for name in generated:
        if name not in graph:
            raise invalid_arg(f"unexpected inference input '{name}', allowed inputs are: "
                              f"{', '.join(sorted(graph))}")
    for tensor in config_inputs:
        found = graph.get(tensor.name)
        if found is None:
            raise invalid_arg(f"unexpected inference input '{tensor.name}', allowed inputs "
                              f"are: {', '.join(sorted(graph))}")
        _check_tensor(model, "input", tensor, found, batching)
    fed = {t.name for t in config_inputs} | set(generated)
    missing = [t.name for t in graph_inputs if t.name not in fed]
    if missing:
        raise invalid_arg(f"unable to load model '{model}', configuration expects "
                          f"{len(fed)} inputs, model provides {len(graph_inputs)} "
                          f"(not in the configuration: {', '.join(missing)})")


def check_outputs(model: str, config_outputs: Sequence[ConfigTensor],
                  graph_outputs: Sequence[GraphTensor], batching: bool) -> None:
    graph = {t.name: t for t in graph_outputs}
    for tensor in config_outputs:
        found = graph.get(tensor.name)
        if found is None:
            raise invalid_arg(f"unexpected inference output '{tensor.name}', allowed outputs "
                              f"are: {', '.join(sorted(graph))}")
        _check_tensor(model, "output", tensor, found, batching)


def _check_tensor(model: str, role: str, tensor: ConfigTensor, graph: GraphTensor,
                  batching: bool) -> None:
    if tensor.datatype != graph.datatype:
        raise invalid_arg(f"unexpected datatype {wire_to_config(tensor.datatype)} for inference "
                          f"{role} '{tensor.name}', expecting {config_type_name(graph)}")
    if tensor.dims is None or (not graph.dims and not tensor.dims):
        return
    model_dims = list(graph.dims)
    if batching:
        if not model_dims or model_dims[0] != -1:
            raise invalid_arg(f"model '{model}', tensor '{tensor.name}': for the model to "
                              "support batching the shape should have at least 1 dimension and "
                              "the first dimension must be -1; but shape expected by the model "
                              f"is {model_dims}")
        model_dims = model_dims[1:]
    config_dims = list(tensor.dims)
    if len(model_dims) != len(config_dims) or any(
            m != -1 and m != c for m, c in zip(model_dims, config_dims, strict=False)):
        raise invalid_arg(f"model '{model}', tensor '{tensor.name}': the model expects "
                          f"{len(model_dims)} dimensions (shape {model_dims}) but the model "
                          f"configuration specifies {len(config_dims)} dimensions (shape "
                          f"{config_dims})")
