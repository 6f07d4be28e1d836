"""Loading and unloading models over the API (``--model-control-mode=explicit``): the optional
DataPlane extension that does it, and the gate HTTP and gRPC share, with Triton's messages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from shoal.errors import unavailable, unsupported
from shoal.settings import FrontendSettings, ModelControlMode


@runtime_checkable
class ModelControl(Protocol):
    """Optional DataPlane extension for ``--model-control-mode=explicit``. ``parameters`` holds
    the load request's ``config`` (JSON text) and ``file:<path>`` entries (decoded bytes)."""

    async def load_model(self, name: str, parameters: Mapping[str, str | bytes]) -> None: ...

    async def unload_model(self, name: str, unload_dependents: bool) -> None: ...


def require_model_control(settings: FrontendSettings, control: ModelControl | None,
                          repository_named: bool) -> ModelControl:
    """The load / unload gate shared by HTTP and gRPC, with Triton's messages."""
    if repository_named:
        raise unsupported("'repository_name' specification is not supported")
    if settings.model_control.mode is not ModelControlMode.EXPLICIT:
        raise unavailable("explicit model load / unload is not allowed if polling is enabled")
    if control is None:
        raise unsupported("model load / unload is not supported by this server")
    return control
