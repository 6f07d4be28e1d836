"""The catalog entry of the ``identity`` backend (``catalog.py``);
nothing heavy is imported here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.workers.backends.catalog import BuiltinBackend

if TYPE_CHECKING:
    from shoal.workers.backends.base import Backend


def _make() -> Backend:
    from shoal.workers.backends.identity.backend import IdentityBackend

    return IdentityBackend()


BACKEND = BuiltinBackend("identity", _make)
