"""shoal's ``c_python_backend_utils``: the name of Triton's compiled stub module, which a few
models import directly (``import c_python_backend_utils as c_utils``). It holds the same
classes as ``triton_python_backend_utils`` (``pb_utils``) and ``shared_memory.free_memory()``:
in Triton the bytes free in the stub's shared-memory pool, in shoal the bytes the worker's
output arena can still take (its maximum size less what live answers hold), so the
figure a model reads before and after a restart of its instance compares the same way.
Installed in ``sys.modules`` beside ``pb_utils`` by ``loader.py``. Its arena is sized by
``--shm-arena-byte-size``.
"""

from __future__ import annotations

import types
from collections.abc import Callable

from shoal.workers.backends.python.pb_utils import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    Logger,
    Metric,
    MetricFamily,
    MetricKind,
    Tensor,
    TritonError,
    TritonModelException,
)

__all__ = [
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL", "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "InferenceRequest", "InferenceResponse",
    "InferenceResponseSender", "Logger", "Metric", "MetricFamily", "MetricKind", "Tensor",
    "TritonError", "TritonModelException", "set_free_memory_probe", "shared_memory",
]

_free_bytes: Callable[[], int] | None = None


def set_free_memory_probe(probe: Callable[[], int] | None) -> None:
    """The python backend, at load: where ``shared_memory.free_memory()`` reads."""
    global _free_bytes
    _free_bytes = probe


def _free_memory() -> int:
    return _free_bytes() if _free_bytes is not None else 0


shared_memory = types.SimpleNamespace(free_memory=_free_memory)
