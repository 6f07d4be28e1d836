"""OpenVINO element types as Triton data types (Triton's openvino_utils: ConvertFromOpenVINO
Element / ModelConfigDataTypeToOpenVINOElement). Pure functions over type names, so the broker's
auto-complete and the backend share them without importing openvino here.

Not carried: ``string`` (BYTES) and ``bf16``, which Triton's openvino backend does not map
either; a model with such a tensor fails its load (UNSUPPORTED) naming the tensor.
"""

from __future__ import annotations

from typing import Final

# ov.Type.get_type_name() -> wire data type
_WIRE_OF_ELEMENT: Final = {
    "boolean": "BOOL", "u8": "UINT8", "u16": "UINT16", "u32": "UINT32", "u64": "UINT64",
    "i8": "INT8", "i16": "INT16", "i32": "INT32", "i64": "INT64",
    "f16": "FP16", "f32": "FP32", "f64": "FP64",
}
_ELEMENT_OF_WIRE: Final = {wire: element for element, wire in _WIRE_OF_ELEMENT.items()}


def wire_of_element(element: str) -> str:
    """The wire data type of OpenVINO element type ``element`` ("f32" -> "FP32"); "" when
    Triton has none for it."""
    return _WIRE_OF_ELEMENT.get(element, "")


def element_of_wire(wire: str) -> str:
    """The OpenVINO element type name of wire data type ``wire``; "" when there is none."""
    return _ELEMENT_OF_WIRE.get(wire, "")


def config_type_name(wire: str) -> str:
    """The config ``data_type`` name of a wire type (TYPE_INVALID for "")."""
    return f"TYPE_{wire}" if wire else "TYPE_INVALID"
