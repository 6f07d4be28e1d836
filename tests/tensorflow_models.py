"""Small SavedModels built with ``tf.Module`` (no downloads, no Keras), shared by the tensorflow
backend's unit and end-to-end tests. ``save(module, directory)`` writes one as
``tf.saved_model.save`` does; ``write_model`` places it at ``<repo>/<name>/1/model.savedmodel``
(with ``config.pbtxt`` when given).
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

MLP_W1 = np.random.default_rng(7).standard_normal((4, 8)).astype(np.float32)
MLP_W2 = np.random.default_rng(8).standard_normal((8, 3)).astype(np.float32)


class Mlp(tf.Module):  # type: ignore[misc]
    """x FP32 [batch, 4] -> y FP32 [batch, 3] (relu(x @ W1) @ W2, weights in variables)."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = tf.Variable(MLP_W1)
        self.w2 = tf.Variable(MLP_W2)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def serve(self, x: Any) -> Any:
        return {"y": tf.matmul(tf.nn.relu(tf.matmul(x, self.w1)), self.w2)}


class AddSub(tf.Module):  # type: ignore[misc]
    """INPUT0, INPUT1 FP32 [batch, 4] -> OUTPUT0 = sum, OUTPUT1 = difference; a second
    signature ``product`` -> PRODUCT."""

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32),
                                  tf.TensorSpec([None, 4], tf.float32)])
    def serve(self, INPUT0: Any, INPUT1: Any) -> Any:
        return {"OUTPUT0": INPUT0 + INPUT1, "OUTPUT1": INPUT0 - INPUT1}

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32),
                                  tf.TensorSpec([None, 4], tf.float32)])
    def product(self, INPUT0: Any, INPUT1: Any) -> Any:
        return {"PRODUCT": INPUT0 * INPUT1}


class Strings(tf.Module):  # type: ignore[misc]
    """TEXT BYTES [batch, 2] -> UPPER BYTES (upper-cased), LENGTH INT32 (byte lengths);
    HALF FP16 [batch, 3] -> HALF_OUT = HALF * 2."""

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.string),
                                  tf.TensorSpec([None, 3], tf.float16)])
    def serve(self, TEXT: Any, HALF: Any) -> Any:
        return {"UPPER": tf.strings.upper(TEXT), "LENGTH": tf.strings.length(TEXT),
                "HALF_OUT": HALF * tf.constant(2, tf.float16)}


class FixedShape(tf.Module):  # type: ignore[misc]
    """x INT64 [2, 3] (no batch dim) -> doubled INT64 [2, 3]; total INT64 [] (a scalar)."""

    @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.int64)])
    def serve(self, x: Any) -> Any:
        return {"doubled": x * 2, "total": tf.reduce_sum(x)}


def save(module: Any, directory: pathlib.Path, **signatures: str) -> pathlib.Path:
    """Save ``module`` with its ``serve`` method as ``serving_default`` and each
    ``signatures[key] = method name`` beside it."""
    functions = {"serving_default": module.serve}
    functions.update({key: getattr(module, method) for key, method in signatures.items()})
    tf.saved_model.save(module, str(directory), signatures=functions)
    return directory


def write_model(repo: pathlib.Path, name: str, module: Any, config: str | None = None,
                **signatures: str) -> pathlib.Path:
    """``<repo>/<name>/1/model.savedmodel`` (and ``config.pbtxt`` when given); returns the
    SavedModel directory."""
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    return save(module, model_dir / "1" / "model.savedmodel", **signatures)


def add_sub_graphdef() -> bytes:
    """A frozen GraphDef: placeholders INPUT0, INPUT1 FP32 [batch, 4] -> nodes OUTPUT0 (sum),
    OUTPUT1 (difference)."""
    graph = tf.Graph()
    with graph.as_default():
        a = tf.compat.v1.placeholder(tf.float32, [None, 4], name="INPUT0")
        b = tf.compat.v1.placeholder(tf.float32, [None, 4], name="INPUT1")
        tf.identity(a + b, name="OUTPUT0")
        tf.identity(a - b, name="OUTPUT1")
    return bytes(graph.as_graph_def().SerializeToString())


class SequenceControls(tf.Module):  # type: ignore[misc]
    """A sequence model taking the START and READY control inputs: INPUT, START, READY INT32
    [batch, 1] -> OUTPUT = READY * (INPUT + START)."""

    @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.int32)] * 3)
    def serve(self, INPUT: Any, START: Any, READY: Any) -> Any:
        return {"OUTPUT": READY * (INPUT + START)}


def sequence_controls_graphdef() -> bytes:
    """The GraphDef of ``SequenceControls``: placeholders INPUT, START, READY INT32 [batch, 1]
    -> node OUTPUT."""
    graph = tf.Graph()
    with graph.as_default():
        value, start, ready = (tf.compat.v1.placeholder(tf.int32, [None, 1], name=name)
                               for name in ("INPUT", "START", "READY"))
        tf.identity(ready * (value + start), name="OUTPUT")
    return bytes(graph.as_graph_def().SerializeToString())
