"""How many copies of each resource exist (Triton's ``ResourceManager::UpdateResourceLimits``).

By default a resource has as many copies as the most any instance that lists it needs, per
device (``GLOBAL`` for a global resource). With ``--rate-limit-resource`` given, the flags set
the copies instead: a device-specific flag for that device, a flag without a device for every
device, the largest matching flag for a global resource; a resource no flag names has none.
Configurations that could never run are refused with Triton's messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from shoal.broker.rate_limiter.config import ALL_DEVICES, InstanceNeeds
from shoal.errors import invalid_arg

GLOBAL: Final = -2  # the scope of a global resource (devices are >= 0)

Scope = int  # a device id, or GLOBAL
Limits = dict[tuple[Scope, str], int]


def needs_by_scope(device: int, needs: InstanceNeeds) -> dict[tuple[Scope, str], int]:
    """(scope, resource name) -> copies one execution of an instance on ``device`` holds."""
    return {(GLOBAL if r.is_global else device, r.name): r.count for r in needs.resources}


def resource_limits(instances: Iterable[tuple[int, InstanceNeeds]],
                    explicit: Sequence[tuple[str, int, int]]) -> Limits:
    """``instances``: (device id, needs) of every instance registered; ``explicit``: the
    --rate-limit-resource flags (name, count, device or ALL_DEVICES). Raises
    ShoalError(INVALID_ARG) when some instance could never get its resources."""
    required: Limits = {}
    for device, needs in instances:
        for key, count in needs_by_scope(device, needs).items():
            required[key] = max(required.get(key, 0), count)
    global_names = {name for scope, name in required if scope == GLOBAL}
    for scope, name in required:
        if scope != GLOBAL and name in global_names:
            raise invalid_arg(f'Resource "{name}" is present as both global and device-specific '
                              "resource in the model configuration.")
    if not explicit:
        return required
    limits: Limits = {}
    for (scope, name), needed in required.items():
        available = max((count for r_name, count, device in explicit if r_name == name and (
            scope == GLOBAL or device in (scope, ALL_DEVICES))), default=0)
        if available < needed:
            raise invalid_arg(f'Resource count for "{name}" is limited to {available} which will '
                              "prevent scheduling of one or more model instances, the minimum "
                              f"required count is {needed}")
        limits[(scope, name)] = available
    return limits
