"""Triton's rate limiter (``--rate-limit execution_count``): an instance executes only while the
resources its instance group lists are free, and among the instances waiting for them the one
with the lowest ``executions x priority`` goes first. Pure: the broker loop drives it."""

from shoal.broker.rate_limiter.config import (
    ALL_DEVICES,
    InstanceNeeds,
    ResourceNeed,
    instance_needs,
    parse_resource_flag,
)
from shoal.broker.rate_limiter.limiter import RateLimiter
from shoal.broker.rate_limiter.limits import GLOBAL, resource_limits

__all__ = ["ALL_DEVICES", "GLOBAL", "InstanceNeeds", "RateLimiter", "ResourceNeed",
           "instance_needs", "parse_resource_flag", "resource_limits"]
