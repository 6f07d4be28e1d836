"""Triton's JSON trace records: header, one record per timestamp, tensor records and their text."""

from __future__ import annotations

import json

import numpy as np

from shoal.dtypes import serialize_bytes
from shoal.messages import InferResponse, TraceStamps
from shoal.trace.record import RequestTrace, TensorCopy
from shoal.trace.triton_format import tensor_data_text, trace_json, trace_records


def tensor(datatype: str, array: np.ndarray) -> TensorCopy:
    return TensorCopy("T", datatype, tuple(array.shape), array.tobytes())


def test_tensor_text_as_triton_writes_it() -> None:
    assert tensor_data_text(tensor("FP32", np.array([[0.1, 2.0], [1e-7, 123456789.0]],
                                                    np.float32))) == "0.1,2,1e-07,1.23457e+08"
    assert tensor_data_text(tensor("INT64", np.array([-1, 2**40]))) == "-1,1099511627776"
    assert tensor_data_text(tensor("UINT8", np.array([0, 255], np.uint8))) == "0,255"
    assert tensor_data_text(tensor("BOOL", np.array([True, False]))) == "1,0"
    assert tensor_data_text(tensor("FP16", np.array([1.0], np.float16))) == ""
    strings = TensorCopy("S", "BYTES", (2,), serialize_bytes([b"ab", b"c,d"]))
    assert tensor_data_text(strings) == '"ab","c,d"'


def test_records_in_file_order() -> None:
    trace = RequestTrace(7, "simple", None, tensors=True)
    trace.stamps = [("HTTP_RECV_START", 1), ("REQUEST_START", 2)]
    trace.model_version, trace.request_id = 3, "abc"
    trace.inputs = [tensor("INT32", np.array([1, 2], np.int32))]
    trace.outputs = [tensor("INT32", np.array([3], np.int32))]
    trace.answered(InferResponse(1, trace=TraceStamps(3, 4, 5, 6, 7)))
    records = trace_records(trace)
    assert records[0] == {"id": 7, "model_name": "simple", "model_version": 3,
                          "request_id": "abc"}
    names = [r["timestamps"][0]["name"] if "timestamps" in r else r["activity"]
             for r in records[1:]]
    assert names == ["HTTP_RECV_START", "REQUEST_START", "QUEUE_START", "TENSOR_QUEUE_INPUT",
                     "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
                     "TENSOR_BACKEND_OUTPUT", "COMPUTE_END", "REQUEST_END"]
    assert records[4]["tensor"] == {"name": "T", "data": "1,2", "shape": "2", "dtype": "INT32"}
    assert [r["timestamps"][0]["ns"] for r in records[1:4]] == [1, 2, 3]
    assert json.loads(b"[" + trace_json(trace) + b"]") == records


def test_unreached_stamps_are_left_out_and_tensors_go_last() -> None:
    trace = RequestTrace(1, "m", None, tensors=True)
    trace.inputs = [tensor("INT32", np.array([1], np.int32))]
    trace.stamp("REQUEST_START")
    trace.answered(InferResponse(1, trace=TraceStamps(queue_start=5)))
    names = [r.get("activity") or r.get("timestamps", [{}])[0].get("name")
             for r in trace_records(trace)[1:]]
    assert names == ["REQUEST_START", "QUEUE_START", "TENSOR_QUEUE_INPUT", "REQUEST_END"]


def test_without_timestamps_level_only_tensors_are_written() -> None:
    trace = RequestTrace(1, "m", None, tensors=True)
    trace.timestamps = False
    trace.inputs = [tensor("INT32", np.array([1], np.int32))]
    trace.stamp("REQUEST_START")
    assert [sorted(r) for r in trace_records(trace)] == [
        ["id", "model_name", "model_version"], ["activity", "id", "tensor"]]
