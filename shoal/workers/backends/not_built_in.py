"""Triton backends that shoal does not build in, and what to do instead.

Contract: ``not_built_in(name)`` is the UNSUPPORTED error a model naming one of Triton's other
backends gets at load (instead of "unknown backend"): which backend it is, that shoal does not
ship it (or, for one shoal builds in as an optional extra, that the extra is not installed and
how to install it), and the way to serve such a model here. Out-of-tree modules and
``shoal.backends`` entry points of the same name are found first (registry.py), so a user's own
backend wins.
"""

from __future__ import annotations

from typing import Final

from shoal.errors import ErrorCode, ShoalError

_ONNX_EXTRA: Final = "pip install 'shoal[onnx]'"

# backends shoal builds in when their package is installed: backend -> its extra
_EXTRA: Final[dict[str, str]] = {"tensorflow": "tensorflow", "openvino": "openvino"}
_INSTEAD: Final[dict[str, str]] = {
    "tensorflow": (
        "TensorFlow SavedModel / GraphDef models: export the model to ONNX (tf2onnx) and serve "
        f"it with the onnxruntime backend ({_ONNX_EXTRA})"),
    "tensorrt": (
        "TensorRT plans: serve the model's ONNX form with the onnxruntime backend and "
        "optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "
        "\"tensorrt\" } ] } } (onnxruntime-gpu with TensorRT)"),
    "openvino": (
        "OpenVINO IR models: serve the model's ONNX form with the onnxruntime backend and "
        "optimization { execution_accelerators { cpu_execution_accelerator : [ { name : "
        "\"openvino\" } ] } } (onnxruntime-openvino)"),
    "dali": (
        "DALI pipelines: do the preprocessing in a python model (or a python step of an "
        "ensemble)"),
}


def not_built_in(name: str) -> ShoalError | None:
    """The error for Triton backend ``name`` if shoal knows it but does not ship it."""
    instead = _INSTEAD.get(name)
    if instead is None:
        return None
    extra = _EXTRA.get(name)
    if extra is not None:
        return ShoalError(
            ErrorCode.UNSUPPORTED,
            f"backend '{name}' is not installed: install it with pip install 'shoal[{extra}]'. "
            f"Or, for {instead}")
    return ShoalError(
        ErrorCode.UNSUPPORTED,
        f"backend '{name}' is not installed: shoal does not ship Triton's {name} backend. "
        f"For {instead}; or add a shoal_backend_{name} module or a 'shoal.backends' entry point "
        f"named '{name}'")
