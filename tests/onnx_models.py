"""Small ONNX models built with the ``onnx`` helper API (no downloads, no exporter), shared by
the onnxruntime backend's unit and end-to-end tests. Each ``write_*`` returns the model's
serialized bytes after writing ``<repo>/<name>/1/model.onnx`` (and ``config.pbtxt`` when given).
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

OPSET = 17
IR_VERSION = 9  # what onnxruntime 1.17+ reads


def _model(nodes: list[object], inputs: list[object], outputs: list[object],
           initializers: list[object] = ()) -> bytes:  # type: ignore[assignment]
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def _tensor(name: str, elem: int, shape: list[object]) -> object:
    return helper.make_tensor_value_info(name, elem, shape)


MLP_W1 = np.random.default_rng(7).standard_normal((4, 8)).astype(np.float32)
MLP_W2 = np.random.default_rng(8).standard_normal((8, 3)).astype(np.float32)


def add_sub() -> bytes:
    """INPUT0, INPUT1 FP32 [batch, 4] -> OUTPUT0 = sum, OUTPUT1 = difference (batchable)."""
    f = TensorProto.FLOAT
    return _model(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        [_tensor("INPUT0", f, ["batch", 4]), _tensor("INPUT1", f, ["batch", 4])],
        [_tensor("OUTPUT0", f, ["batch", 4]), _tensor("OUTPUT1", f, ["batch", 4])])


def mlp() -> bytes:
    """x FP32 [batch, 4] -> y FP32 [batch, 3] = relu(x W1) W2."""
    f = TensorProto.FLOAT
    return _model(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]),
         helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])],
        [_tensor("x", f, ["batch", 4])], [_tensor("y", f, ["batch", 3])],
        [numpy_helper.from_array(MLP_W1, "w1"), numpy_helper.from_array(MLP_W2, "w2")])


def strings_and_half() -> bytes:
    """TEXT BYTES [batch, 2] -> TEXT_OUT (identity); HALF FP16 [batch, 3] -> HALF_OUT = 2 HALF."""
    two = numpy_helper.from_array(np.array(2.0, np.float16), "two")
    return _model(
        [helper.make_node("Identity", ["TEXT"], ["TEXT_OUT"]),
         helper.make_node("Mul", ["HALF", "two"], ["HALF_OUT"])],
        [_tensor("TEXT", TensorProto.STRING, ["batch", 2]),
         _tensor("HALF", TensorProto.FLOAT16, ["batch", 3])],
        [_tensor("TEXT_OUT", TensorProto.STRING, ["batch", 2]),
         _tensor("HALF_OUT", TensorProto.FLOAT16, ["batch", 3])],
        [two])


def fixed_shape() -> bytes:
    """x INT32 [2, 3] -> y INT64 [3] = column sums (cannot batch: no symbolic first dim)."""
    return _model(
        [helper.make_node("Cast", ["x"], ["x64"], to=TensorProto.INT64),
         helper.make_node("ReduceSum", ["x64", "axes"], ["y"], keepdims=0)],
        [_tensor("x", TensorProto.INT32, [2, 3])], [_tensor("y", TensorProto.INT64, [3])],
        [numpy_helper.from_array(np.array([0], np.int64), "axes")])


def bf16_scale() -> bytes:
    """B BF16 [batch, 2] -> B_OUT BF16 [batch, 2] = B * 2 (computed in FP32: ONNX Runtime's CPU
    provider has no BF16 Mul)."""
    f = TensorProto.FLOAT
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    return _model(
        [helper.make_node("Cast", ["B"], ["b32"], to=f),
         helper.make_node("Mul", ["b32", "two"], ["m"]),
         helper.make_node("Cast", ["m"], ["B_OUT"], to=TensorProto.BFLOAT16)],
        [_tensor("B", TensorProto.BFLOAT16, ["batch", 2])],
        [_tensor("B_OUT", TensorProto.BFLOAT16, ["batch", 2])], [two])


def accumulate() -> bytes:
    """Implicit-state accumulator: VALUE INT64 [batch, 1] and state SUM_IN INT64 [batch, 1] ->
    SUM and state SUM_OUT = SUM_IN + VALUE."""
    i = TensorProto.INT64
    return _model(
        [helper.make_node("Add", ["SUM_IN", "VALUE"], ["SUM"]),
         helper.make_node("Identity", ["SUM"], ["SUM_OUT"])],
        [_tensor("VALUE", i, ["batch", 1]), _tensor("SUM_IN", i, ["batch", 1])],
        [_tensor("SUM", i, ["batch", 1]), _tensor("SUM_OUT", i, ["batch", 1])])


def ragged_double() -> bytes:
    """Ragged batching: INPUT FP32 [n] (every request's elements, flat) -> OUT = 2 INPUT [n];
    COUNT INT32 [requests] (a batch_input) -> COUNT_OUT (identity)."""
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    return _model(
        [helper.make_node("Mul", ["INPUT", "two"], ["OUT"]),
         helper.make_node("Identity", ["COUNT"], ["COUNT_OUT"])],
        [_tensor("INPUT", TensorProto.FLOAT, ["n"]), _tensor("COUNT", TensorProto.INT32, ["r"])],
        [_tensor("OUT", TensorProto.FLOAT, ["n"]), _tensor("COUNT_OUT", TensorProto.INT32, ["r"])],
        [two])


def sequence_controls(*, batching: bool = True, batch: object = "batch") -> bytes:
    """A sequence model whose graph takes the START and READY control inputs (what the sequence
    batcher fills): INPUT, START, READY INT32 [batch, 1] (``[1]`` without ``batching``) ->
    OUTPUT INT32 = READY * (INPUT + START). ``batch``: the first dim (a name is dynamic)."""
    i = TensorProto.INT32
    shape: list[object] = [batch, 1] if batching else [1]
    return _model(
        [helper.make_node("Add", ["INPUT", "START"], ["started"]),
         helper.make_node("Mul", ["READY", "started"], ["OUTPUT"])],
        [_tensor(name, i, shape) for name in ("INPUT", "START", "READY")],
        [_tensor("OUTPUT", i, shape)])


def all_sequence_controls() -> bytes:
    """A sequence model whose graph takes all four controls: INPUT, START, END, READY INT32 and
    CORRID UINT64 [batch, 1] -> OUTPUT INT32 = READY * (INPUT + START + END * int32(CORRID))."""
    i = TensorProto.INT32
    return _model(
        [helper.make_node("Cast", ["CORRID"], ["corrid"], to=i),
         helper.make_node("Mul", ["END", "corrid"], ["ended"]),
         helper.make_node("Add", ["INPUT", "START"], ["started"]),
         helper.make_node("Add", ["started", "ended"], ["total"]),
         helper.make_node("Mul", ["READY", "total"], ["OUTPUT"])],
        [*(_tensor(name, i, ["batch", 1]) for name in ("INPUT", "START", "END", "READY")),
         _tensor("CORRID", TensorProto.UINT64, ["batch", 1])],
        [_tensor("OUTPUT", i, ["batch", 1])])


def typed_controls_accumulate() -> bytes:
    """Controls of other data types beside an implicit state: VALUE INT64, START FP32, END and
    READY BOOL, CORRID STRING and state SUM_IN INT64, all [batch, 1] ->
    SUM = state SUM_OUT = SUM_IN + VALUE on a ready row (else SUM_IN), FLAGS INT32 [batch, 2] =
    (int32(START), int32(END)), CORRID_OUT = CORRID."""
    i64, i32 = TensorProto.INT64, TensorProto.INT32
    return _model(
        [helper.make_node("Add", ["SUM_IN", "VALUE"], ["added"]),
         helper.make_node("Where", ["READY", "added", "SUM_IN"], ["SUM"]),
         helper.make_node("Identity", ["SUM"], ["SUM_OUT"]),
         helper.make_node("Cast", ["START"], ["start"], to=i32),
         helper.make_node("Cast", ["END"], ["end"], to=i32),
         helper.make_node("Concat", ["start", "end"], ["FLAGS"], axis=1),
         helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"])],
        [_tensor("VALUE", i64, ["batch", 1]), _tensor("START", TensorProto.FLOAT, ["batch", 1]),
         _tensor("END", TensorProto.BOOL, ["batch", 1]),
         _tensor("READY", TensorProto.BOOL, ["batch", 1]),
         _tensor("CORRID", TensorProto.STRING, ["batch", 1]),
         _tensor("SUM_IN", i64, ["batch", 1])],
        [_tensor("SUM", i64, ["batch", 1]), _tensor("SUM_OUT", i64, ["batch", 1]),
         _tensor("FLAGS", i32, ["batch", 2]), _tensor("CORRID_OUT", TensorProto.STRING,
                                                      ["batch", 1])])


def write_model(repo: pathlib.Path, name: str, model: bytes, config: str | None = None,
                *, as_directory: bool = False) -> bytes:
    version = repo / name / "1"
    version.mkdir(parents=True)
    target = version / "model.onnx"
    if as_directory:
        target.mkdir()
        target = target / "model.onnx"
    target.write_bytes(model)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config)
    return model
