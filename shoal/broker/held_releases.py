"""Lease releases on their way from the broker to workers, held so that they ride on a message
the broker sends anyway (issue #16 part 4: under load a forwarded ReleaseLeases was up to 18% of
the broker's busy time, and messages, not bytes, are what a request costs).

A worker reads releases only between batches (``workers/proc.serve``), so releases for a worker
that is executing cannot free anything before its BatchResult: they are held and ride on that
worker's next ``Batch`` (``take``, which the worker applies before executing). Releases for a
worker that is not executing are held only until the end of the current broker loop pass
(``due``), so that they too ride on a Batch dispatched in the same pass; whatever no Batch took
then leaves as one ReleaseLeases per worker. Releases for a worker that is gone or dead are
dropped (its arena went with it), now (``add``) or when it is found so (``due``, ``drop``).

Pure bookkeeping: the caller says what state a worker is in and does the sending.
Single-threaded: the broker loop.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from shoal.messages import Lease


class Hold(enum.Enum):
    """What to do with releases for one worker, by its state."""

    DROP = "drop"  # gone or dead: nothing to free any more
    UNTIL_BATCH = "until_batch"  # executing: ride on its next Batch
    UNTIL_PASS_END = "until_pass_end"  # anything else: ride on a Batch of this pass, or go alone


class HeldReleases:
    def __init__(self) -> None:
        self._held: dict[str, list[Lease]] = {}

    def __bool__(self) -> bool:
        return bool(self._held)

    def add(self, instance: str, leases: list[Lease], hold: Hold) -> None:
        """Hold ``leases`` for worker ``instance`` (dropped if ``hold`` is DROP)."""
        if hold is Hold.DROP or not leases:
            return
        self._held.setdefault(instance, []).extend(leases)

    def take(self, instance: str) -> list[Lease]:
        """The releases held for ``instance``, now handed to the Batch about to be sent to it."""
        return self._held.pop(instance, [])

    def drop(self, instance: str) -> int:
        """``instance`` exited: forget what was held for it; returns how many leases."""
        return len(self._held.pop(instance, []))

    def due(self, hold_of: Callable[[str], Hold]) -> list[tuple[str, list[Lease]]]:
        """End of a loop pass: the releases to send now, one list per worker (those of workers
        that are not executing); those of dead or gone workers are dropped, those of executing
        workers stay held."""
        if not self._held:
            return []
        ready: list[tuple[str, list[Lease]]] = []
        for instance in list(self._held):
            hold = hold_of(instance)
            if hold is Hold.UNTIL_BATCH:
                continue
            leases = self._held.pop(instance)
            if hold is Hold.UNTIL_PASS_END:
                ready.append((instance, leases))
        return ready

    def held_for(self, instance: str) -> int:
        """How many leases are held for ``instance`` (statistics, tests)."""
        return len(self._held.get(instance, []))
