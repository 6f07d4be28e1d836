"""The model config against a SavedModel's signature at load, as Triton's tensorflow backend
checks it (``savedmodel::ValidateTRITONTFModel``), so a mismatch fails the load with a message
naming the tensor instead of failing every request:

- the config's inputs (plus ``batch_input`` and sequence control tensors) are exactly as many as
  the signature's, and each names a signature input; each output names a signature output;
- each sequence control tensor is a signature input of the control's data type and of dims
  ``[1]`` (without the batch dim), the shape the sequence batcher feeds;
- dims (``reshape`` when given, with the batch dim when ``max_batch_size`` > 0) match the
  signature's shape: -1 in either matches anything for inputs, outputs must match exactly; a
  signature tensor of rank 0 (or unknown rank) takes the config's dims;
- data types are equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shoal.dtypes import config_to_wire
from shoal.errors import invalid_arg
from shoal.workers.backends.sequence_controls import ModelInput, check_control
from shoal.workers.backends.tensorflow.signature import Signature, SignatureTensor
from shoal.workers.backends.torchscript_io import IoSpec

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


def check_config(model: str, config: ModelConfig, signature: Signature,
                 controls: Sequence[IoSpec]) -> None:
    """INVALID_ARG naming the first mismatch between ``config`` (a ModelConfig, whose sequence
    control inputs are ``controls``: ``sequence_controls.control_inputs``) and ``signature``."""
    batching = config.max_batch_size > 0
    inputs = {t.name: t for t in signature.inputs}
    outputs = {t.name: t for t in signature.outputs}
    for control in controls:
        tensor = inputs.get(control.name)
        check_control(model, control,
                      None if tensor is None else ModelInput(tensor.dims or None, tensor.datatype),
                      batching, "tensorflow")
    expected = len(config.input) + len(config.batch_input) + len(controls)
    for io in config.input:
        _check_io(model, io, inputs, "input", batching, exact=False)
    if expected != len(signature.inputs):
        raise invalid_arg(f"unable to load model '{model}', configuration expects "
                          f"{expected} inputs, model provides {len(signature.inputs)}")
    for out in config.output:
        _check_io(model, out, outputs, "output", batching, exact=True)


def _check_io(model: str, io: Any, tensors: dict[str, SignatureTensor], kind: str,
              batching: bool, *, exact: bool) -> None:
    tensor = tensors.get(io.name)
    if tensor is None:
        raise invalid_arg(f"unable to load model '{model}': unexpected inference {kind} "
                          f"'{io.name}', allowed {kind}s are: {', '.join(sorted(tensors))}")
    dims = [int(d) for d in (io.reshape.shape if io.HasField("reshape") else io.dims)]
    if tensor.dims:
        _compare_dims(model, io.name, list(tensor.dims), dims, batching, exact)
    datatype = config_to_wire(_type_name(io.data_type))
    if datatype != tensor.datatype:
        raise invalid_arg(f"unable to load model '{model}', configuration expects datatype "
                          f"{_type_name(io.data_type)} for {kind} '{io.name}', model provides "
                          f"{_config_type(tensor.datatype)}")


def _compare_dims(model: str, name: str, model_shape: list[int], dims: list[int],
                  batching: bool, exact: bool) -> None:
    if batching and model_shape[0] != -1:
        raise invalid_arg(f"model '{model}', tensor '{name}': for the model to support batching "
                          "the shape should have at least 1 dimension and the first dimension "
                          f"must be -1; but shape expected by the model is {model_shape}")
    unbatched = model_shape[1:] if batching else model_shape
    same = len(unbatched) == len(dims) and all(
        m == d for m, d in zip(unbatched, dims, strict=True)
        if exact or (m != -1 and d != -1))
    if not same:
        full = ([-1] if batching else []) + dims
        raise invalid_arg(f"model '{model}', tensor '{name}': the model expects "
                          f"{len(model_shape)} dimensions (shape {model_shape}) but the model "
                          f"configuration specifies {len(full)} dimensions (shape {full})")


def _type_name(data_type: int) -> str:
    from tritonclient.grpc import model_config_pb2

    # ValueType: int at run time, the enum's NewType in the stub (typings/)
    return str(model_config_pb2.DataType.Name(model_config_pb2.DataType.ValueType(data_type)))


def _config_type(wire: str) -> str:
    return "TYPE_STRING" if wire == "BYTES" else f"TYPE_{wire}"
