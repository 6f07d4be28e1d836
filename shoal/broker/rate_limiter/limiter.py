"""The rate limiter's state: which instances wait to execute, which hold resources, and who goes
next (Triton's ``RateLimiter``: staged instances in a priority queue, only its head may take
resources).

Protocol, all on the broker loop:

    an idle instance of a model with queued work:  stage(instance, device, needs)
    then, and after every release:                 while grant_next(start): pass
    its execution ended (or its worker died):       release(instance)

``grant_next`` looks at the staged instance with the lowest ``executions x priority`` (ties: the
one staged first). If its resources are not all free it stops there: nobody behind it runs
first, so a heavy instance is not starved by light ones. If they are, it calls ``start(instance)``,
which forms and sends a batch and returns False when the instance has nothing to run (or is no
longer idle); such an instance leaves the queue without taking anything and the next is tried.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from shoal.broker.rate_limiter.config import InstanceNeeds
from shoal.broker.rate_limiter.limits import Limits, Scope, needs_by_scope, resource_limits


@dataclass(slots=True)
class _Staged:
    needs: dict[tuple[Scope, str], int]
    order: int  # its heap entry's; an older entry of the same instance is stale


class RateLimiter:
    """``explicit``: the --rate-limit-resource flags (name, count, device or ALL_DEVICES)."""

    def __init__(self, explicit: Sequence[tuple[str, int, int]] = ()) -> None:
        self.explicit = list(explicit)
        self.limits: Limits = {}
        self._allocated: dict[tuple[Scope, str], int] = {}
        self._held: dict[str, dict[tuple[Scope, str], int]] = {}
        self._staged: dict[str, _Staged] = {}
        self._heap: list[tuple[int, int, str]] = []  # (executions x weight, order, instance)
        self._order = itertools.count()
        self.executions: dict[str, int] = {}

    def set_instances(self, instances: Iterable[tuple[int, InstanceNeeds]]) -> None:
        """The (device, needs) of every instance loaded, loading or draining (after each model
        load or unload). Raises ShoalError(INVALID_ARG) as ``resource_limits``."""
        self.limits = resource_limits(instances, self.explicit)

    def stage(self, instance: str, device: int, needs: InstanceNeeds) -> None:
        """``instance`` is idle and its model has queued work; it waits for its turn. Staging
        an instance that is already staged or holds resources changes nothing."""
        if instance in self._staged or instance in self._held:
            return
        order = next(self._order)
        self._staged[instance] = _Staged(needs_by_scope(device, needs), order)
        rank = self.executions.get(instance, 0) * needs.weight
        heapq.heappush(self._heap, (rank, order, instance))

    def grant_next(self, start: Callable[[str], bool]) -> bool:
        """Start the next staged instance whose turn it is and whose resources are free; True
        if one started (call again), False if none can now."""
        while self._heap:
            _, order, instance = self._heap[0]
            staged = self._staged.get(instance)
            if staged is None or staged.order != order:  # withdrawn, or staged again since
                heapq.heappop(self._heap)
                continue
            if not self._fits(staged.needs):
                return False
            heapq.heappop(self._heap)
            del self._staged[instance]
            if not start(instance):
                continue
            for key, count in staged.needs.items():
                self._allocated[key] = self._allocated.get(key, 0) + count
            self._held[instance] = staged.needs
            return True
        return False

    def release(self, instance: str) -> None:
        """``instance``'s execution ended: its resources are free again and it counts one more
        execution. Also withdraws it from the queue (its worker died). No-op if it held none."""
        self._staged.pop(instance, None)
        held = self._held.pop(instance, None)
        if held is None:
            return
        self.executions[instance] = self.executions.get(instance, 0) + 1
        for key, count in held.items():
            self._allocated[key] -= count

    def forget(self, instance: str) -> None:
        """``instance``'s worker is gone: drop what it held and its execution count."""
        self.release(instance)
        self.executions.pop(instance, None)

    def holds(self, instance: str) -> bool:
        return instance in self._held

    def allocated(self, scope: Scope, name: str) -> int:
        return self._allocated.get((scope, name), 0)

    def _fits(self, needs: dict[tuple[Scope, str], int]) -> bool:
        return all(self._allocated.get(key, 0) + count <= self.limits.get(key, 0)
                   for key, count in needs.items())
