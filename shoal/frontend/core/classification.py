"""Triton's classification extension, protocol-neutral: an output asked for as ``classification``
is answered as its top-k entries in text (HTTP's ``http/response.py`` and gRPC's
``grpc/encode.py`` both call ``classify``)."""

from __future__ import annotations

import struct
from typing import Any, Final

import numpy as np

from shoal import dtypes
from shoal.errors import invalid_arg
from shoal.frontend.core.validation import CLASSIFIABLE
from shoal.messages import TensorRef

_LENGTH = struct.Struct("<I")
# Triton's bound (server #8603): classifying a batch entry of more elements than this is refused
# (INVALID_ARG) rather than sorting it, so an output cannot make the frontend sort without end
MAX_CLASSIFICATION_ELEMENTS: Final = 1_000_000


def classify(
    ref: TensorRef, view: memoryview, top_n: int, batching: bool
) -> tuple[str, list[int], bytes]:
    """Top-``top_n`` of each batch entry, Triton's ``TopkClassifications``: descending by value
    (ties keep the lower index first), each as ``"<value>:<index>"``; BYTES shape [batch, k]
    when the model batches, else [k]. A batch entry of more than
    ``MAX_CLASSIFICATION_ELEMENTS`` is INVALID_ARG "classification output tensor too large"."""
    if ref.datatype not in CLASSIFIABLE:
        raise invalid_arg(
            f"class result not available for output '{ref.name}' due to unsupported type "
            f"'{ref.datatype}'"
        )
    values = np.frombuffer(view, dtypes.numpy_dtype(ref.datatype))
    batch = ref.shape[0] if batching and ref.shape else 0
    if batch:
        per_row = values.size // batch
        rows = values[:batch * per_row].reshape(batch, per_row)
    else:
        rows = values.reshape(1, -1)
    if rows.shape[1] > MAX_CLASSIFICATION_ELEMENTS:
        raise invalid_arg("classification output tensor too large")  # Triton's text
    k = min(top_n, rows.shape[1])
    as_text = _format_float if values.dtype.kind == "f" else _format_int
    parts: list[bytes] = []
    for row in rows:
        reversed_order = np.argsort(row[::-1], kind="stable")[::-1]
        for index in (len(row) - 1 - reversed_order[:k]).tolist():
            text = f"{as_text(row[index])}:{index}".encode()
            parts.append(_LENGTH.pack(len(text)))
            parts.append(text)
    shape = [batch, k] if batch else [k]
    return "BYTES", shape, b"".join(parts)


def _format_float(value: Any) -> str:
    return f"{float(value):f}"  # C++ std::to_string(float|double): "%f"


def _format_int(value: Any) -> str:
    return str(int(value))
