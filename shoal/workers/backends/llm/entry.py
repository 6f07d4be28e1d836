"""The catalog entry of the ``llm`` backend (``catalog.py``);
nothing heavy is imported here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from shoal.workers.backends.catalog import BuiltinBackend

if TYPE_CHECKING:
    from shoal.workers.backends.base import Backend


def _make() -> Backend:
    from shoal.workers.backends.llm.backend import LlmBackend

    return LlmBackend()


def _device_parts(parameters: Mapping[str, str], model_dir: str,
                  free_bytes: int | None) -> dict[str, int] | None:
    from shoal.workers.backends.llm.device_need import llm_instance_bytes

    return llm_instance_bytes(parameters, model_dir, free_bytes)


BACKEND = BuiltinBackend("llm", _make, thread_policy=True, device_parts=_device_parts)
