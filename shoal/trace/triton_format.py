"""Triton's JSON trace records for one request (pure; the writer thread calls it).

A trace is a run of JSON objects in the trace file's top-level array, all with the trace's
``id`` (tracer.cc): first ``{"id", "model_name", "model_version"[, "request_id"]}``, then one
``{"id", "timestamps": [{"name", "ns"}]}`` per timestamp in the order they happened, and at level
TENSORS ``{"id", "activity", "tensor": {"name", "data", "shape", "dtype"}}`` records:
TENSOR_QUEUE_INPUT after QUEUE_START, TENSOR_BACKEND_OUTPUT after COMPUTE_OUTPUT_START (at the
end when those stamps are missing; a trace without level TIMESTAMPS has no timestamp records).
Tensor ``data`` and ``shape`` are comma-separated text as
Triton writes them: numbers (floats with 6 significant digits, C++ stream style), BOOL as 1/0,
BYTES elements in double quotes; FP16 and BF16 data is left empty (Triton does the same).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from shoal.dtypes import deserialize_bytes, element_count, numpy_dtype
from shoal.trace.record import (
    COMPUTE_OUTPUT_START,
    QUEUE_START,
    TENSOR_BACKEND_OUTPUT,
    TENSOR_QUEUE_INPUT,
    RequestTrace,
    TensorCopy,
)


def tensor_data_text(tensor: TensorCopy) -> str:
    """The ``data`` string of a tensor record."""
    datatype = tensor.datatype
    count = element_count(tensor.shape)
    if datatype in ("FP16", "BF16"):
        return ""
    if datatype == "BYTES":
        items = deserialize_bytes(tensor.data, count)
        return ",".join('"' + item.decode("utf-8", "backslashreplace") + '"' for item in items)
    values = np.frombuffer(tensor.data, dtype=numpy_dtype(datatype), count=count)
    if datatype == "BOOL":
        return ",".join("1" if v else "0" for v in values.tolist())
    if datatype in ("FP32", "FP64"):
        return ",".join(format(v, "g") for v in values.tolist())
    return ",".join(str(v) for v in values.tolist())


def _tensor_record(trace_id: int, activity: str, tensor: TensorCopy) -> dict[str, Any]:
    try:
        data = tensor_data_text(tensor)
    except Exception:  # a tensor whose bytes do not match its shape: say so, keep the trace
        data = "<unreadable>"
    return {"id": trace_id, "activity": activity, "tensor": {
        "name": tensor.name, "data": data, "shape": ",".join(str(d) for d in tensor.shape),
        "dtype": tensor.datatype}}


def trace_records(trace: RequestTrace) -> list[dict[str, Any]]:
    """The trace's objects, in file order."""
    tid = trace.trace_id
    header: dict[str, Any] = {"id": tid, "model_name": trace.model_name,
                              "model_version": trace.model_version}
    if trace.request_id:
        header["request_id"] = trace.request_id
    records = [header]
    inputs = [_tensor_record(tid, TENSOR_QUEUE_INPUT, t) for t in trace.inputs]
    outputs = [_tensor_record(tid, TENSOR_BACKEND_OUTPUT, t) for t in trace.outputs]
    for name, ns in trace.stamps if trace.timestamps else ():
        records.append({"id": tid, "timestamps": [{"name": name, "ns": ns}]})
        if name == QUEUE_START:
            records += inputs
            inputs = []
        elif name == COMPUTE_OUTPUT_START:
            records += outputs
            outputs = []
    return records + inputs + outputs


def trace_json(trace: RequestTrace) -> bytes:
    """The trace's objects as a comma-separated run of JSON (no enclosing brackets)."""
    return b",".join(orjson.dumps(record) for record in trace_records(trace))
