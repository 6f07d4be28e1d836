"""The built-in backends, one entry each, found in the backends' own folders: each backend
package that has an ``entry`` module defines ``BACKEND`` there, a ``BuiltinBackend`` naming how
a worker makes it, how the broker completes its configs, whether the server's CPU thread policy
applies to it and what one GPU instance holds on its device. A new built-in backend is one new
folder (its ``entry.py`` beside its code); nothing else names it.

Contract: entry modules import nothing heavy (no framework, no torch): the broker reads this
catalog, and every callable of an entry imports its module when called.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

    from shoal.workers.backends.base import Backend

def _always() -> bool:
    return True


@dataclass(frozen=True)
class BuiltinBackend:
    """``make``: a new, unloaded instance (imports the backend's module).
    ``aliases``: other names a config may give (``pytorch_libtorch``).
    ``installed``: False when its optional package is missing (the load then gets
    ``not_built_in``'s error, naming the extra).
    ``file_auto_complete``: the backend's Triton auto-complete from the model file, run in the
    broker (None: a python model's ``auto_complete_config``, if any, is the only one).
    ``thread_policy``: the backend applies the thread policy's default intra-op count.
    ``device_parts``: the bytes one GPU instance holds, per part, for the device ledger (None:
    the ledger's general rule)."""

    name: str
    make: Callable[[], Backend]
    aliases: tuple[str, ...] = ()
    installed: Callable[[], bool] = _always
    file_auto_complete: Callable[[str, ModelConfig, int], ModelConfig] | None = None
    thread_policy: bool = False
    device_parts: Callable[[Mapping[str, str], str, int | None], dict[str, int] | None] \
        | None = None


@functools.cache
def builtin_backends() -> Mapping[str, BuiltinBackend]:
    """Every built-in backend by name and by alias."""
    import shoal.workers.backends as package

    found: dict[str, BuiltinBackend] = {}
    for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not module.ispkg:
            continue
        try:
            entry_module = importlib.import_module(f"{package.__name__}.{module.name}.entry")
        except ModuleNotFoundError as exc:
            if exc.name != f"{package.__name__}.{module.name}.entry":
                raise
            continue
        entry: BuiltinBackend = entry_module.BACKEND
        for name in (entry.name, *entry.aliases):
            found[name] = entry
    return found


def builtin_backend(name: str) -> BuiltinBackend | None:
    """The built-in backend ``name`` (or alias) names, installed or not; None if none."""
    return builtin_backends().get(name)
