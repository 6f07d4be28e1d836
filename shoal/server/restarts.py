"""When the supervisor restarts a frontend that died (pure; the clock is passed in, seconds of
``time.monotonic``).

A death within ``QUICK_DEATH_S`` of the frontend's start is a quick one. Quick deaths in a row
wait ``BACKOFF_S`` (0 s for the first, so a crash costs clients only the restart itself); the
``MAX_QUICK_DEATHS``-th in a row gives up (the supervisor then stops the server, exit 1). A
frontend that served ``QUICK_DEATH_S`` or longer starts the count afresh.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

QUICK_DEATH_S: Final = 30.0
MAX_QUICK_DEATHS: Final = 5
BACKOFF_S: Final = (0.0, 0.5, 1.0, 2.0, 4.0)


@dataclass
class RestartTracker:
    """The restart history of one frontend index."""

    started_at: float
    quick_deaths: int = 0  # in a row

    def died(self, now: float) -> float | None:
        """The frontend exited at ``now``: seconds to wait before starting it again, or None to
        give up."""
        if now - self.started_at >= QUICK_DEATH_S:
            self.quick_deaths = 0
        self.quick_deaths += 1
        if self.quick_deaths >= MAX_QUICK_DEATHS:
            return None
        return BACKOFF_S[min(self.quick_deaths - 1, len(BACKOFF_S) - 1)]

    def started(self, now: float) -> None:
        self.started_at = now
