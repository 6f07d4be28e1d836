"""The catalog entry of the ``python`` backend (``catalog.py``);
nothing heavy is imported here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.workers.backends.catalog import BuiltinBackend

if TYPE_CHECKING:
    from shoal.workers.backends.base import Backend


def _make() -> Backend:
    from shoal.workers.backends.python.backend import PythonBackend

    return PythonBackend()


# the thread policy applies only when the model file imports torch (the backend checks)
BACKEND = BuiltinBackend("python", _make, thread_policy=True)
