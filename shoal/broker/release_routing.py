"""Where a returned output lease goes (docs/architecture.md §3): an ensemble run's lease to the
ensemble driver at once; a worker's into ``HeldReleases``, to ride on the worker's next Batch or
leave at the end of the loop pass as one ReleaseLeases (``flush``); a dead worker's nowhere (its
arena went with it). The loop routes every lease a frontend, a BLS caller or an ensemble gives
back through ``forward``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from shoal.broker.ensemble.driver import ENSEMBLE_LEASE
from shoal.broker.held_releases import HeldReleases, Hold
from shoal.broker.pool import WorkerState
from shoal.broker.worker_link import WorkerLink
from shoal.messages import Lease, ReleaseLeases


class ReleaseRouting:
    def __init__(self, workers: WorkerLink, held: HeldReleases) -> None:
        self.workers = workers
        self.held = held
        # the ensemble driver's release (set once it exists: it forwards leases through here)
        self.ensemble_release: Callable[[list[int]], None] | None = None

    def forward(self, leases: list[Lease]) -> None:
        """Leases their holders gave back: an ensemble run's at once; a worker's are held to
        ride on its next Batch, or sent at the end of this pass if it is not executing (then a
        Batch of this pass may still take them); a dead worker's are dropped."""
        grouped: dict[str, list[Lease]] = defaultdict(list)
        for lease in leases:
            grouped[lease.instance].append(lease)
        ensemble_runs = grouped.pop(ENSEMBLE_LEASE, [])
        if ensemble_runs and self.ensemble_release is not None:
            self.ensemble_release([lease.lease_id for lease in ensemble_runs])
        for instance, group in grouped.items():
            self.held.add(instance, group, self.hold_of(instance))

    def hold_of(self, instance: str) -> Hold:
        entry = self.workers.entries.get(instance)
        if entry is None or entry[0].state is WorkerState.DEAD:
            return Hold.DROP
        return Hold.UNTIL_BATCH if entry[0].state is WorkerState.BUSY else Hold.UNTIL_PASS_END

    def flush(self) -> None:
        """End of a loop pass: releases that no Batch took and whose worker is not executing
        leave as one ReleaseLeases per worker."""
        for instance, leases in self.held.due(self.hold_of):
            self.workers.send(instance, ReleaseLeases(leases))
