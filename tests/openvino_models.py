"""Small OpenVINO models for the openvino backend's tests, built with openvino's own opset API
and saved as IR (``model.xml`` + ``model.bin``) with ``ov.save_model``: no downloads, no
converter. Importing this module needs the ``openvino`` package (tests importorskip it)."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import openvino as ov
import openvino.opset13 as ops


def _named(node: Any, name: str) -> Any:
    node.output(0).get_tensor().set_names({name})
    return node


def _batch_layouts(model: Any) -> Any:
    for port in [*model.inputs, *model.outputs]:
        ov.layout_helpers.set_layout(port, ov.Layout("N..."))
    return model


def add_sub(*, layout: bool = True) -> Any:
    """INPUT0, INPUT1 [-1, 4] FP32 -> OUTPUT0 = sum, OUTPUT1 = difference; batch layouts
    ("N...") on every tensor unless ``layout`` is False."""
    a = _named(ops.parameter([-1, 4], ov.Type.f32, name="INPUT0"), "INPUT0")
    b = _named(ops.parameter([-1, 4], ov.Type.f32, name="INPUT1"), "INPUT1")
    total = _named(ops.add(a, b), "OUTPUT0")
    difference = _named(ops.subtract(a, b), "OUTPUT1")
    model = ov.Model([total, difference], [a, b], "add_sub")
    return _batch_layouts(model) if layout else model


def mlp() -> Any:
    """x [-1, 4] FP32 -> y [-1, 3] = relu(x @ W + c), fixed weights; batch layouts."""
    rng = np.random.default_rng(7)
    x = _named(ops.parameter([-1, 4], ov.Type.f32, name="x"), "x")
    weights = ops.constant(rng.standard_normal((4, 3)).astype(np.float32))
    bias = ops.constant(rng.standard_normal(3).astype(np.float32))
    y = _named(ops.relu(ops.add(ops.matmul(x, weights, False, False), bias)), "y")
    return _batch_layouts(ov.Model([y], [x], "mlp"))


def fixed_sum() -> Any:
    """x [2, 3] INT32 -> y [3] INT32 = column sums; static shapes, no layout (cannot batch)."""
    x = _named(ops.parameter([2, 3], ov.Type.i32, name="x"), "x")
    y = _named(ops.reduce_sum(x, ops.constant(np.array([0], np.int64)), False), "y")
    return ov.Model([y], [x], "fixed_sum")


def write_ir(version_dir: pathlib.Path, model: Any, filename: str = "model.xml") -> pathlib.Path:
    """Save ``model`` as IR in ``version_dir`` (``model.xml`` + ``model.bin``), FP32 weights."""
    version_dir.mkdir(parents=True, exist_ok=True)
    path = version_dir / filename
    ov.save_model(model, str(path), compress_to_fp16=False)
    return path


def write_model(repo: pathlib.Path, name: str, model: Any, config: str | None = None) -> None:
    """``<repo>/<name>/1/model.xml`` (+ bin) and, when given, ``config.pbtxt``."""
    write_ir(repo / name / "1", model)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config)


def reference(model: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """``model`` run by OpenVINO in process (the oracle the served outputs must equal)."""
    compiled = ov.Core().compile_model(model, "CPU")
    result = compiled(inputs)
    return [np.asarray(result[port]) for port in compiled.outputs]
