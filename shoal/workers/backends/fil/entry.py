"""The catalog entry of the ``fil`` backend (``catalog.py``);
nothing heavy is imported here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.workers.backends.catalog import BuiltinBackend

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

    from shoal.workers.backends.base import Backend


def _make() -> Backend:  # imports xgboost / lightgbm / treelite only at load
    from shoal.workers.backends.fil.backend import FilBackend

    return FilBackend()


def _auto_complete(model_dir: str, config: ModelConfig, default_max_batch: int) -> ModelConfig:
    from shoal.workers.backends.fil.autocomplete import fil_auto_complete

    return fil_auto_complete(model_dir, config, default_max_batch)


# keeps its own thread_count (not the thread policy)
BACKEND = BuiltinBackend("fil", _make, file_auto_complete=_auto_complete)
