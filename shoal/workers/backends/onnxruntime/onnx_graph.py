"""An ONNX file's graph inputs and outputs, read straight from its protobuf wire format: the
broker's auto-complete needs only names, element types and dims, so it neither imports ONNX
Runtime nor starts an interpreter, and it never reads the weights (the file is memory-mapped and
every field it does not need, initializers' data included, is skipped by its length).

What it reports matches ONNX Runtime's ``get_inputs()`` / ``get_outputs()``: graph inputs that
have an initializer of the same name are left out (they are optional, "overridable"); a dim
with a ``dim_param`` or no value is -1; a value without a shape has no dims. Only the fields read
here are checked; a file that parses but is not a valid model fails later, at the instance's
load, with ONNX Runtime's message.

Wire format: ModelProto.graph = 7; GraphProto.initializer = 5, input = 11, output = 12;
TensorProto.name = 8; ValueInfoProto.name = 1, type = 2; TypeProto.tensor_type = 1 (other
value kinds: sequence 4, map 5, sparse tensor 8, optional 9); TypeProto.Tensor.elem_type = 1,
shape = 2; TensorShapeProto.dim = 1; Dimension.dim_value = 1, dim_param = 2.
"""

from __future__ import annotations

import mmap
import os
from typing import Final

from shoal.errors import ErrorCode, ShoalError, invalid_arg
from shoal.workers.backends.onnxruntime.graph_io import GraphTensor
from shoal.workers.backends.protowire import Malformed as _Malformed
from shoal.workers.backends.protowire import fields as _fields
from shoal.workers.backends.protowire import ints as _ints
from shoal.workers.backends.protowire import messages as _messages
from shoal.workers.backends.protowire import text as _text

# TensorProto.DataType -> (ONNX Runtime's type string, wire data type or "" when none)
_ELEMENT_TYPES: Final = {
    1: ("tensor(float)", "FP32"), 2: ("tensor(uint8)", "UINT8"), 3: ("tensor(int8)", "INT8"),
    4: ("tensor(uint16)", "UINT16"), 5: ("tensor(int16)", "INT16"),
    6: ("tensor(int32)", "INT32"), 7: ("tensor(int64)", "INT64"),
    8: ("tensor(string)", "BYTES"), 9: ("tensor(bool)", "BOOL"),
    10: ("tensor(float16)", "FP16"), 11: ("tensor(double)", "FP64"),
    12: ("tensor(uint32)", "UINT32"), 13: ("tensor(uint64)", "UINT64"),
    14: ("tensor(complex64)", ""), 15: ("tensor(complex128)", ""),
    16: ("tensor(bfloat16)", "BF16"),
}
_OTHER_KINDS: Final = {4: "seq", 5: "map", 8: "sparse_tensor", 9: "optional"}


def read_graph_io(path: str) -> tuple[list[GraphTensor], list[GraphTensor]]:
    """(inputs, outputs) of the ONNX model file ``path``, in graph order. INVALID_ARG when the
    file is not an ONNX model; UNSUPPORTED for a non-tensor input or output."""
    name = os.path.basename(path)
    try:
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_size == 0:
                raise invalid_arg(f"ONNX model '{name}' is empty")
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                outcome = _parse(mapped)  # returns with no view of the mapping left
    except OSError as exc:
        raise invalid_arg(f"ONNX model '{name}' cannot be read: {exc.strerror}") from None
    if isinstance(outcome, ShoalError):
        raise outcome
    if outcome is None:
        raise invalid_arg(f"ONNX model '{name}' cannot be parsed: not an ONNX model "
                          "(protobuf parsing failed)")
    return outcome


def _parse(mapped: mmap.mmap) -> tuple[list[GraphTensor], list[GraphTensor]] | ShoalError | None:
    """The graph's I/O, the ShoalError to raise, or None when the bytes are not a model. Raises
    nothing: an exception's traceback would keep views of the mapping alive past its close."""
    try:
        return _model_io(memoryview(mapped))
    except ShoalError as exc:
        return ShoalError(exc.code, exc.message)
    except (_Malformed, IndexError, ValueError):
        return None


def _model_io(data: memoryview) -> tuple[list[GraphTensor], list[GraphTensor]]:
    graphs = _messages(data, 7)
    if not graphs:
        raise _Malformed
    graph = graphs[-1]  # the last one wins, as in protobuf
    initializers = {_text(_messages(tensor, 8)) for tensor in _messages(graph, 5)}
    inputs = [_value_info(info) for info in _messages(graph, 11)]
    outputs = [_value_info(info) for info in _messages(graph, 12)]
    return [t for t in inputs if t.name not in initializers], outputs


def _value_info(info: memoryview) -> GraphTensor:
    name = _text(_messages(info, 1))
    type_protos = _messages(info, 2)
    tensor_types = _messages(type_protos[-1], 1) if type_protos else []
    if not tensor_types:
        other = next((kind for number, kind in _OTHER_KINDS.items()
                      if type_protos and _messages(type_protos[-1], number)), "unknown")
        raise ShoalError(ErrorCode.UNSUPPORTED,
                         f"Unsupported ONNX Type '{other}' for I/O '{name}', "
                         "expected 'ONNX_TYPE_TENSOR'.")
    tensor_type = tensor_types[-1]
    elements = _ints(tensor_type, 1)
    element = elements[-1] if elements else 0
    shapes = _messages(tensor_type, 2)
    dims = tuple(_dim(dim) for dim in _messages(shapes[-1], 1)) if shapes else ()
    onnx_type, datatype = _ELEMENT_TYPES.get(element, (f"tensor(type {element})", ""))
    return GraphTensor(name, datatype, onnx_type, dims)


def _dim(dim: memoryview) -> int:
    """A dim's ``dim_value``; -1 for a ``dim_param``, no value or a negative one."""
    value = -1
    for number, _, item in _fields(dim):
        if number == 1 and isinstance(item, int):
            value = item if item >= 0 else -1
        elif number == 2:
            value = -1
    return value
