"""The catalog entry of the ``pytorch`` backend (``catalog.py``);
nothing heavy is imported here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.workers.backends.catalog import BuiltinBackend

if TYPE_CHECKING:
    from shoal.workers.backends.base import Backend


def _make() -> Backend:
    from shoal.workers.backends.pytorch.backend import PytorchBackend

    return PytorchBackend()


BACKEND = BuiltinBackend("pytorch", _make, aliases=("pytorch_libtorch",), thread_policy=True)
