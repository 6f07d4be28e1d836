"""What the rate limiter reads: ``rate_limiter { resources [{ name global count }] priority }``
per instance group of a model config, and ``--rate-limit-resource <name>:<count>[:<device>]``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from shoal.config.model_config import instance_names
from shoal.errors import invalid_arg

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

ALL_DEVICES: Final = -1  # a --rate-limit-resource without a device: every device's copies


@dataclass(frozen=True, slots=True)
class ResourceNeed:
    """``count`` copies of resource ``name`` held for each execution; ``is_global``: one pool
    for the whole server instead of one per device."""

    name: str
    count: int
    is_global: bool = False


@dataclass(frozen=True, slots=True)
class InstanceNeeds:
    """One instance's rate limiter configuration (its group's). ``priority`` 0 counts as 1, as
    in Triton: an instance of priority 2 gets half the turns of one of priority 1."""

    resources: tuple[ResourceNeed, ...] = ()
    priority: int = 0

    @property
    def weight(self) -> int:
        return max(1, self.priority)


def instance_needs(config: ModelConfig) -> list[InstanceNeeds]:
    """One InstanceNeeds per model instance, in ``model_config.instance_names`` order (per group,
    per count, per listed GPU). Raises ShoalError(INVALID_ARG) naming the field at fault."""
    per_group: list[InstanceNeeds] = []
    for index, group in enumerate(config.instance_group):
        limiter = group.rate_limiter
        resources: list[ResourceNeed] = []
        seen: set[str] = set()
        for r_index, resource in enumerate(limiter.resources):
            field = f"instance_group[{index}].rate_limiter.resources[{r_index}]"
            name = str(resource.name)
            if not name:
                raise invalid_arg(f"{field}.name must not be empty")
            if name in seen:
                raise invalid_arg(f"{field}.name: resource '{name}' is listed twice in "
                                  f"instance_group[{index}]")
            seen.add(name)
            resources.append(ResourceNeed(name, int(resource.count),
                                          bool(getattr(resource, "global"))))
        per_group.append(InstanceNeeds(tuple(resources), int(limiter.priority)))
    return [per_group[group] for _, _, _, group in instance_names(config)]


def parse_resource_flag(text: str) -> tuple[str, int, int]:
    """``<name>:<count>[:<device>]`` -> (name, count, device or ALL_DEVICES). Raises ValueError
    with the reason (the CLI shows it)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(f"'{text}': expected <name>:<count>[:<device>]")
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else ALL_DEVICES
    except ValueError:
        raise ValueError(f"'{text}': count and device must be integers") from None
    if count < 0 or (len(parts) == 3 and device < 0):
        raise ValueError(f"'{text}': count and device must not be negative")
    return parts[0], count, device
