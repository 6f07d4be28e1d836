"""The catalog entry of the ``onnxruntime`` backend (``catalog.py``);
nothing heavy is imported here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.workers.backends.catalog import BuiltinBackend

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

    from shoal.workers.backends.base import Backend


def _make() -> Backend:  # imports onnxruntime only at load (clear error when missing)
    from shoal.workers.backends.onnxruntime.backend import OnnxruntimeBackend

    return OnnxruntimeBackend()


def _auto_complete(model_dir: str, config: ModelConfig, default_max_batch: int) -> ModelConfig:
    from shoal.workers.backends.onnxruntime.autocomplete import onnx_auto_complete

    return onnx_auto_complete(model_dir, config, default_max_batch)


BACKEND = BuiltinBackend("onnxruntime", _make, aliases=("onnxruntime_onnx",),
                         file_auto_complete=_auto_complete, thread_policy=True)
