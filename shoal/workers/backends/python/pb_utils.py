"""shoal's ``triton_python_backend_utils``: a model.py written for Triton imports it unchanged
(``import triton_python_backend_utils as pb_utils``); the python backend installs this module
under that name in ``sys.modules`` before importing the model.

BLS (``InferenceRequest.exec``/``async_exec``, ``ResponseIterator``) and model control
(``load_model``/``unload_model``/``is_model_ready``) go through the worker's BLS connection
(``pb_bls``). Differences from Triton, all explicit: BLS outputs are always in host memory
(``preferred_memory`` is accepted and ignored); custom metrics (``MetricFamily``,
``pb_metrics``) are exported on ``GET :8002/metrics``, each instance keeping its own values;
``Logger`` writes to Python logging (logger ``shoal.model``).
This module imports no torch (auto-complete runs without it).
"""

from __future__ import annotations

import enum
import logging
import struct
from typing import Any

import numpy as np
import numpy.typing as npt

from shoal.workers.backends.python import pb_bls
from shoal.workers.backends.python.pb_bls import ResponseIterator
from shoal.workers.backends.python.pb_metrics import Metric, MetricFamily, MetricKind
from shoal.workers.backends.python.pb_model_config import ModelConfig
from shoal.workers.backends.python.pb_request import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    InferenceTrace,
    PreferredMemory,
    TritonError,
)
from shoal.workers.backends.python.pb_tensor import (
    Tensor,
    TritonModelException,
    numpy_to_triton_type,
    triton_to_numpy_type,
)

__all__ = [
    "TRITONSERVER_MEMORY_CPU", "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL", "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "TRITON_STRING_TO_NUMPY", "InferenceRequest",
    "InferenceResponse", "InferenceResponseSender", "InferenceTrace", "Logger", "Metric",
    "MetricFamily", "MetricKind", "ModelConfig", "PreferredMemory", "ResponseIterator", "Tensor",
    "TritonError", "TritonModelException", "deserialize_bytes_tensor", "get_input_config_by_name",
    "get_input_tensor_by_name", "get_model_dir", "get_output_config_by_name",
    "get_output_tensor_by_name", "is_model_ready", "load_model", "numpy_to_triton_type",
    "serialize_byte_tensor", "triton_string_to_numpy", "triton_to_numpy_type",
    "unload_model", "using_decoupled_model_transaction_policy",
]

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32, "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

_model_logger = logging.getLogger("shoal.model")
_model_dir = ""


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Elements of an object/bytes array -> 0-d object array holding the BYTES framing."""
    if input_tensor.size == 0:
        return np.empty([0], dtype=np.object_)
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        raise TritonModelException("cannot serialize bytes tensor: invalid datatype")
    parts: list[bytes] = []
    for item in input_tensor.reshape(-1, order="C"):
        if isinstance(item, bytes):
            data = item
        elif input_tensor.dtype == np.object_:
            data = str(item).encode("utf-8")
        else:
            data = bytes(item)
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return np.asarray(b"".join(parts), dtype=np.object_)


def deserialize_bytes_tensor(encoded_tensor: Any) -> npt.NDArray[Any]:
    """BYTES framing (bytes or a uint8 buffer) -> 1-D object array of ``bytes``."""
    buffer = bytes(memoryview(encoded_tensor).cast("B"))
    items: list[bytes] = []
    offset = 0
    while offset < len(buffer):
        (length,) = struct.unpack_from("<I", buffer, offset)
        offset += 4
        items.append(buffer[offset:offset + length])
        offset += length
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse,
                              name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for properties in model_config.get("input", []):
        if properties["name"] == name:
            return properties  # type: ignore[no-any-return]
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for properties in model_config.get("output", []):
        if properties["name"] == name:
            return properties  # type: ignore[no-any-return]
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    policy = model_config.get("model_transaction_policy")
    return bool(policy.get("decoupled", False)) if policy else False


def get_model_dir() -> str:
    return _model_dir


def set_model_dir(model_dir: str) -> None:
    """Backend-internal: the directory ``get_model_dir`` reports (the version dir, as Triton)."""
    global _model_dir
    _model_dir = model_dir


def load_model(model_name: str, config: str = "", files: Any = None) -> None:
    """Load (or reload) ``model_name`` (explicit model control mode); returns once it is ready.
    ``config``: a model config JSON replacing config.pbtxt; ``files``: ``{"file:1/model.py":
    b"..."}`` (needs ``config``). Raises TritonModelException when the load fails."""
    pb_bls.load_model(model_name, config, files)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Stop serving ``model_name`` (explicit mode; returns once new requests are refused)."""
    pb_bls.unload_model(model_name, unload_dependents)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    return pb_bls.is_model_ready(model_name, model_version)


class LogLevel(enum.IntEnum):
    """``pb_utils.Logger.LogLevel`` (its members also as ``Logger.INFO`` ...)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_Level = LogLevel  # the annotation inside Logger, whose own ``LogLevel`` is an attribute


def _message(message: Any) -> str:
    """A log message as Triton's bindings take it (a C++ string: str or bytes, else
    TypeError)."""
    if isinstance(message, str):
        return message
    if isinstance(message, bytes):
        return message.decode("utf-8", "replace")
    raise TypeError(f"log message must be a str, not {type(message).__name__}")


class Logger:
    """``pb_utils.Logger``: static methods that write to Python logging. A level is a
    ``Logger.LogLevel`` (a plain int or None is a TypeError, as in Triton)."""

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE
    _LEVELS = {LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING,
               LogLevel.ERROR: logging.ERROR, LogLevel.VERBOSE: logging.DEBUG}

    @staticmethod
    def log(message: str, level: _Level = LogLevel.INFO) -> None:
        if not isinstance(level, LogLevel):
            raise TypeError(f"Logger.log(): level must be a pb_utils.Logger.LogLevel, not "
                            f"{type(level).__name__}")
        _model_logger.log(Logger._LEVELS[level], "%s", _message(message))

    @staticmethod
    def log_info(message: str) -> None:
        _model_logger.info("%s", _message(message))

    @staticmethod
    def log_warn(message: str) -> None:
        _model_logger.warning("%s", _message(message))

    @staticmethod
    def log_error(message: str) -> None:
        _model_logger.error("%s", _message(message))

    @staticmethod
    def log_verbose(message: str) -> None:
        _model_logger.debug("%s", _message(message))
