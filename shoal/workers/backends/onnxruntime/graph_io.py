"""An ONNX graph's inputs and outputs as Triton's onnxruntime backend sees them: name, Triton
data type and dims, where a symbolic or unknown dim is -1 (ONNX Runtime's C API reports -1
for those; its Python API gives a name or None). Pure functions over ONNX Runtime's NodeArgs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from shoal.errors import ErrorCode, ShoalError

# ONNX Runtime type strings -> wire data types. Triton's onnxruntime backend has no BF16
# (it maps bfloat16 to TYPE_INVALID); shoal carries BF16 as uint16 bit patterns and accepts it.
_WIRE_OF_ONNX: Final = {
    "tensor(bool)": "BOOL", "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64", "tensor(int8)": "INT8",
    "tensor(int16)": "INT16", "tensor(int32)": "INT32", "tensor(int64)": "INT64",
    "tensor(float16)": "FP16", "tensor(float)": "FP32", "tensor(double)": "FP64",
    "tensor(string)": "BYTES", "tensor(bfloat16)": "BF16",
}
# ONNX TensorProto element type of BF16 (OrtValues over uint16 buffers are typed with it).
ONNX_BFLOAT16: Final = 16


@dataclass(frozen=True)
class GraphTensor:
    name: str
    datatype: str  # wire name ("FP32", "BYTES", ...), "" when Triton has none for it
    onnx_type: str  # as ONNX Runtime names it, e.g. "tensor(float)"
    dims: tuple[int, ...]  # -1 for a symbolic or unknown dim


def graph_tensors(node_args: Iterable[Any]) -> list[GraphTensor]:
    """``session.get_inputs()`` or ``get_outputs()`` as GraphTensors, in graph order. A non-tensor
    I/O (sequence, map) is UNSUPPORTED, as in Triton."""
    tensors: list[GraphTensor] = []
    for arg in node_args:
        onnx_type = str(arg.type)
        if not onnx_type.startswith("tensor("):
            raise ShoalError(ErrorCode.UNSUPPORTED,
                             f"Unsupported ONNX Type '{onnx_type}' for I/O '{arg.name}', "
                             "expected 'ONNX_TYPE_TENSOR'.")
        dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or []))
        tensors.append(GraphTensor(str(arg.name), _WIRE_OF_ONNX.get(onnx_type, ""),
                                   onnx_type, dims))
    return tensors


def config_type_name(tensor: GraphTensor) -> str:
    """The config ``data_type`` name Triton would write for ``tensor`` (TYPE_INVALID for types
    it cannot carry)."""
    if not tensor.datatype:
        return "TYPE_INVALID"
    return "TYPE_STRING" if tensor.datatype == "BYTES" else f"TYPE_{tensor.datatype}"
