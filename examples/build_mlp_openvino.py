"""Build examples/openvino_repository/mlp_openvino/1/model.xml + model.bin: the benchmark MLP
of examples/build_mlp_onnx.py (the same weights) read by OpenVINO from the committed ONNX file
and saved as OpenVINO IR, with a batch layout ("N...") on its input and output so the openvino
backend's auto-complete lets it batch. The files are committed; this script reproduces them.
Needs the ``openvino`` package (``pip install 'shoal[openvino]'``)."""

from __future__ import annotations

import argparse
import pathlib

import openvino as ov

HERE = pathlib.Path(__file__).parent


def build(source: pathlib.Path, path: pathlib.Path) -> None:
    model = ov.Core().read_model(str(source))  # INPUT__0 [?, 256] -> OUTPUT__0 [?, 16]
    for port in [*model.inputs, *model.outputs]:
        ov.layout_helpers.set_layout(port, ov.Layout("N..."))
    path.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(path), compress_to_fp16=False)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", type=pathlib.Path,
                        default=HERE / "onnx_repository" / "mlp_onnx" / "1" / "model.onnx")
    parser.add_argument("--output", type=pathlib.Path,
                        default=HERE / "openvino_repository" / "mlp_openvino" / "1" / "model.xml")
    arguments = parser.parse_args()
    build(arguments.source, arguments.output)
