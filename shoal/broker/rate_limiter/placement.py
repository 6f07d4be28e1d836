"""The broker's runtimes as the rate limiter sees them: (device id, needs) per instance."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from shoal.broker.rate_limiter.config import InstanceNeeds
from shoal.broker.rate_limiter.limits import resource_limits

if TYPE_CHECKING:
    from shoal.broker.model_runtime import ModelVersionRuntime


def placed_needs(runtimes: Iterable[ModelVersionRuntime]) -> list[tuple[int, InstanceNeeds]]:
    return [(slot.device_id, slot.rate_needs) for runtime in runtimes
            for slot in runtime.instances]


def check_load(held: Iterable[ModelVersionRuntime], loading: Iterable[ModelVersionRuntime],
               explicit: list[tuple[str, int, int]]) -> None:
    """Raises ShoalError(INVALID_ARG) with Triton's message when the loading runtimes' resources,
    next to those of every runtime already held, could never all be scheduled."""
    resource_limits(placed_needs([*held, *loading]), explicit)
