"""TorchScript models as Triton's pytorch_backend sees them: which config tensor is which
``forward()`` argument or output (its three naming conventions), what ``forward()`` may take and
return, and the per-tensor spec the backend works from. Pure functions, no state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

from shoal.dtypes import DATATYPES, config_to_wire, torch_dtype
from shoal.errors import ErrorCode, ShoalError, invalid_arg

Array = npt.NDArray[Any]

_DELIMITER = "__"
_OUTPUT_KIND_ERROR = ("output must be of type Tensor, List[str] or Tuple containing one of these "
                      "two types. It should not be a List / Dictionary of Tensors or a Scalar")


@dataclass(frozen=True)
class IoSpec:
    name: str
    datatype: str  # wire name
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None


def named_index(name: str) -> int | None:
    """The index of a ``<name>__<index>`` tensor name (Triton: text after the first "__" must be
    all digits), else None."""
    position = name.find(_DELIMITER)
    if position < 0:
        return None
    suffix = name[position + len(_DELIMITER):]
    if suffix and not suffix.isdigit():
        return None
    return int(suffix or "0")


def input_positions(config_names: list[str], forward_args: list[str]) -> dict[str, int]:
    """Config input name -> forward() argument position (Triton's three naming conventions)."""
    if forward_args and all(name in forward_args for name in config_names):
        return {name: forward_args.index(name) for name in config_names}
    return output_positions(config_names)


def output_positions(config_names: list[str]) -> dict[str, int]:
    indexes = [named_index(name) for name in config_names]
    if all(index is not None for index in indexes):
        return {name: int(index) for name, index in zip(config_names, indexes, strict=True)
                if index is not None}
    return {name: i for i, name in enumerate(config_names)}


def io_spec(io: Any) -> IoSpec:
    from tritonclient.grpc import model_config_pb2

    datatype = config_to_wire(model_config_pb2.DataType.Name(io.data_type))
    reshape = tuple(int(d) for d in io.reshape.shape) if io.HasField("reshape") else None
    return IoSpec(io.name, datatype, tuple(int(d) for d in io.dims), reshape)


def forward_arguments(module: Any) -> tuple[list[str], bool]:
    """forward()'s argument names (without self) and whether it takes one Dict[str, Tensor]."""
    arguments = list(module.forward.schema.arguments)
    if arguments and arguments[0].type.kind() == "ClassType":
        arguments = arguments[1:]
    if len(arguments) == 1 and arguments[0].type.kind() == "DictType":
        return [], True
    for argument in arguments:
        if argument.type.kind() not in ("TensorType", "ListType"):
            raise invalid_arg(f"An input of type '{argument.type}' was detected in the model. "
                              "Only a single input of type Dict(str, Tensor) or input(s) of "
                              "type Tensor are supported.")
    return [argument.name for argument in arguments], False


def flatten_outputs(torch: Any, result: Any) -> list[Any]:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, list) and all(isinstance(item, str) for item in result):
        return [result]
    if not isinstance(result, tuple):
        raise ShoalError(ErrorCode.INTERNAL, _OUTPUT_KIND_ERROR)
    for item in result:
        is_strings = isinstance(item, list) and all(isinstance(s, str) for s in item)
        if not (isinstance(item, torch.Tensor) or is_strings):
            raise ShoalError(ErrorCode.INTERNAL, _OUTPUT_KIND_ERROR)
    return list(result)


def reshape_output(spec: IoSpec, array: Array, prefix: tuple[int, ...]) -> Array:
    if spec.reshape is None:
        return array
    return array.reshape(prefix + spec.dims)


def wire_of_torch(torch: Any, dtype: Any) -> str | None:
    for name in DATATYPES:
        if name != "BYTES" and torch_dtype(name) == dtype:
            return name
    return None
