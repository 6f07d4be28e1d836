"""Build examples/onnx_repository/mlp_onnx/1/model.onnx: the benchmark MLP of
examples/build_mlp.py (same seed, same weights) as an ONNX graph, FP32 [-1, 256] -> [-1, 16],
written with the onnx helper API (no exporter). The file is committed; this script reproduces
it. Needs the ``onnx`` package (``pip install onnx``)."""

from __future__ import annotations

import argparse
import pathlib
import sys

import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from build_mlp import MLP


def build(path: pathlib.Path, seed: int = 0) -> None:
    torch.manual_seed(seed)
    mlp = MLP().eval()  # the same draws as build_mlp.build: the same weights
    weights = {
        "hidden_w": mlp.hidden.weight.detach().numpy().T.copy(),
        "hidden_b": mlp.hidden.bias.detach().numpy(),
        "out_w": mlp.out.weight.detach().numpy().T.copy(),
        "out_b": mlp.out.bias.detach().numpy(),
    }
    nodes = [
        helper.make_node("Gemm", ["INPUT__0", "hidden_w", "hidden_b"], ["hidden"]),
        helper.make_node("Relu", ["hidden"], ["relu"]),
        helper.make_node("Gemm", ["relu", "out_w", "out_b"], ["OUTPUT__0"]),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("INPUT__0", TensorProto.FLOAT, ["batch", 256])],
        [helper.make_tensor_value_info("OUTPUT__0", TensorProto.FLOAT, ["batch", 16])],
        [numpy_helper.from_array(array, name) for name, array in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    default = (pathlib.Path(__file__).parent / "onnx_repository" / "mlp_onnx" / "1"
               / "model.onnx")
    parser.add_argument("--output", type=pathlib.Path, default=default)
    build(parser.parse_args().output)
