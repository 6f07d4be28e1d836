"""Hit and miss figures of one frontend's cache per model version, kept until reported to the
broker (``CacheFigures``: increments, so the broker sums every frontend's). Event loop only."""

from __future__ import annotations

from dataclasses import dataclass

from shoal.messages import CacheFigures, ModelCacheFigures


@dataclass
class _Tally:
    hits: int = 0
    hit_ns: int = 0
    misses: int = 0
    miss_ns: int = 0


class CacheFigureBook:
    def __init__(self) -> None:
        self._tallies: dict[tuple[str, int], _Tally] = {}

    def __bool__(self) -> bool:
        return bool(self._tallies)

    def hit(self, model: str, version: int, ns: int) -> None:
        tally = self._tallies.setdefault((model, version), _Tally())
        tally.hits += 1
        tally.hit_ns += ns

    def miss(self, model: str, version: int, ns: int) -> None:
        tally = self._tallies.setdefault((model, version), _Tally())
        tally.misses += 1
        tally.miss_ns += ns

    def take(self) -> CacheFigures | None:
        """The figures since the last ``take`` (None if there are none); the book is empty
        afterwards."""
        if not self._tallies:
            return None
        tallies, self._tallies = self._tallies, {}
        return CacheFigures([ModelCacheFigures(model, version, t.hits, t.hit_ns, t.misses,
                                               t.miss_ns)
                             for (model, version), t in sorted(tallies.items())])
