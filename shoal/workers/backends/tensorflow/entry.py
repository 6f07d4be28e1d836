"""The catalog entry of the ``tensorflow`` backend (``catalog.py``);
nothing heavy is imported here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.workers.backends.catalog import BuiltinBackend

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

    from shoal.workers.backends.base import Backend


def _make() -> Backend:
    from shoal.workers.backends.tensorflow.backend import TensorflowBackend

    return TensorflowBackend()


def _installed() -> bool:  # else not_built_in's error, naming the extra
    from shoal.workers.backends.tensorflow.runtime import tensorflow_installed

    return tensorflow_installed()


def _auto_complete(model_dir: str, config: ModelConfig, default_max_batch: int) -> ModelConfig:
    from shoal.workers.backends.tensorflow.autocomplete import tensorflow_auto_complete

    return tensorflow_auto_complete(model_dir, config, default_max_batch)


BACKEND = BuiltinBackend("tensorflow", _make, installed=_installed,
                         file_auto_complete=_auto_complete, thread_policy=True)
