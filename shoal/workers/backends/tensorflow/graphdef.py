"""``tensorflow_graphdef`` models (a frozen ``model.graphdef`` file) as Triton's tensorflow
backend serves them (``graphdef::ValidateTRITONTFModel``): a GraphDef names no inputs or
outputs, so every ``Placeholder`` node is a potential input and every other node a potential
output; the config must name them (no auto-complete, as in Triton), by node name. The config
is checked at load: at most as many inputs (the sequence control inputs of
``sequence_batching.control_input`` counted) as placeholders, each input and each control a
placeholder of the config's (the control's) data type, each output another node. Controls are
fed like config inputs.

The graph runs in TensorFlow 2 as a function pruned to the config's tensors
(``tf.compat.v1.wrap_function`` + ``prune``): node ``NAME`` is fed and fetched as ``NAME:0``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shoal.dtypes import config_to_wire
from shoal.errors import invalid_arg
from shoal.workers.backends.sequence_controls import ModelInput, check_control
from shoal.workers.backends.tensorflow.signature import WIRE_OF_TF_TYPE
from shoal.workers.backends.torchscript_io import IoSpec

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

Run = Callable[[dict[str, Any]], dict[str, Any]]


def load_graphdef(tf: Any, path: str, shown: str, model: str, config: ModelConfig,
                  controls: list[IoSpec]) -> Run:
    """A function from {input name: tensor} to {output name: tensor} for the GraphDef file
    ``path`` (``shown`` names it in errors; ``controls``: the config's sequence control inputs,
    ``sequence_controls.control_inputs``); INVALID_ARG naming the problem."""
    graph_def = tf.compat.v1.GraphDef()
    try:
        with open(path, "rb") as file:
            graph_def.ParseFromString(file.read())
    except Exception as exc:
        raise invalid_arg(f"unable to load model '{model}': cannot parse GraphDef "
                          f"'{shown}': {type(exc).__name__}") from None
    if not graph_def.node:
        raise invalid_arg(f"model {model} has an empty network")
    placeholders = {node.name: int(node.attr["dtype"].type) for node in graph_def.node
                    if node.op == "Placeholder"}
    others = {node.name for node in graph_def.node if node.op != "Placeholder"}
    inputs = [io.name for io in config.input] + [spec.name for spec in controls]
    outputs = [io.name for io in config.output]
    _check(model, config, controls, placeholders, others)

    def imports() -> None:
        tf.compat.v1.import_graph_def(graph_def, name="")

    try:
        pruned = tf.compat.v1.wrap_function(imports, []).prune(
            feeds=[f"{name}:0" for name in inputs], fetches=[f"{name}:0" for name in outputs])
    except Exception as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raise invalid_arg(f"unable to load model '{model}': cannot import GraphDef '{shown}': "
                          f"{lines[-1] if lines else type(exc).__name__}") from None

    def run(feeds: dict[str, Any]) -> dict[str, Any]:
        return dict(zip(outputs, pruned(*[feeds[name] for name in inputs]), strict=True))

    return run


def _check(model: str, config: ModelConfig, controls: list[IoSpec], placeholders: dict[str, int],
           others: set[str]) -> None:
    expected = len(config.input) + len(controls)
    if expected > len(placeholders):
        raise invalid_arg(f"unable to load model '{model}', configuration expects "
                          f"{expected} inputs, model provides at most {len(placeholders)}")
    for control in controls:  # a placeholder's shape is not read: its data type is checked
        dtype = placeholders.get(control.name)
        check_control(model, control,
                      None if dtype is None else ModelInput(None, WIRE_OF_TF_TYPE.get(dtype, "")),
                      config.max_batch_size > 0, "tensorflow")
    from tritonclient.grpc import model_config_pb2

    for io in config.input:
        if io.name not in placeholders:
            raise invalid_arg(f"unable to load model '{model}': unexpected inference input "
                              f"'{io.name}', allowed inputs are: "
                              f"{', '.join(sorted(placeholders))}")
        type_name = str(model_config_pb2.DataType.Name(io.data_type))
        provided = WIRE_OF_TF_TYPE.get(placeholders[io.name], "")
        if config_to_wire(type_name) != provided:
            raise invalid_arg(f"unable to load model '{model}', configuration expects datatype "
                              f"{type_name} for input '{io.name}', model provides "
                              f"{_config_type(provided)}")
    for out in config.output:
        if out.name not in others:
            raise invalid_arg(f"unable to load model '{model}': unexpected inference output "
                              f"'{out.name}': the GraphDef has no such node (or it is a "
                              "Placeholder)")


def _config_type(wire: str) -> str:
    if not wire:
        return "a type Triton has none for"
    return "TYPE_STRING" if wire == "BYTES" else f"TYPE_{wire}"
