"""Build examples/tensorflow_repository/mlp_tensorflow/1/model.savedmodel: the benchmark MLP of
examples/build_mlp.py (same seed, same weights) as a TensorFlow SavedModel whose serving
signature takes INPUT__0 FP32 [-1, 256] and gives OUTPUT__0 FP32 [-1, 16], written with
``tf.Module`` (no Keras). The directory is committed; this script reproduces it. Needs
TensorFlow (``pip install 'shoal[tensorflow]'``) and torch (for the weights)."""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
from typing import Any

import torch

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from build_mlp import MLP


class TfMlp(tf.Module):  # type: ignore[misc]
    def __init__(self, weights: dict[str, Any]) -> None:
        super().__init__()
        self.hidden_w = tf.Variable(weights["hidden_w"])
        self.hidden_b = tf.Variable(weights["hidden_b"])
        self.out_w = tf.Variable(weights["out_w"])
        self.out_b = tf.Variable(weights["out_b"])

    @tf.function(input_signature=[tf.TensorSpec([None, 256], tf.float32)])
    def serve(self, INPUT__0: Any) -> Any:
        hidden = tf.nn.relu(tf.matmul(INPUT__0, self.hidden_w) + self.hidden_b)
        return {"OUTPUT__0": tf.matmul(hidden, self.out_w) + self.out_b}


def build(path: pathlib.Path, seed: int = 0) -> None:
    torch.manual_seed(seed)
    mlp = MLP().eval()  # the same draws as build_mlp.build: the same weights
    weights = {
        "hidden_w": mlp.hidden.weight.detach().numpy().T.copy(),
        "hidden_b": mlp.hidden.bias.detach().numpy(),
        "out_w": mlp.out.weight.detach().numpy().T.copy(),
        "out_b": mlp.out.bias.detach().numpy(),
    }
    module = TfMlp(weights)
    shutil.rmtree(path, ignore_errors=True)
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    default = (pathlib.Path(__file__).parent / "tensorflow_repository" / "mlp_tensorflow" / "1"
               / "model.savedmodel")
    parser.add_argument("--output", type=pathlib.Path, default=default)
    build(parser.parse_args().output)
