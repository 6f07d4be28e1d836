"""The dashboard's ``llm`` rows: per llm-backend model version, from the executor figures in
successive broker statistics (``ModelStats.llm``).

Gauges (requests, KV blocks) are the latest reading. Token rates are the difference between
this reading and the previous one over the time between them, like the models' request rates.
Time-to-first-token and inter-token percentiles use the difference between this reading and the
oldest one kept in the window (about ``window_s``), like the models' latency percentiles. A
counter that went down means a worker restarted or the version was loaded again: its window
starts afresh.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from shoal.messages import LlmStats, ModelStats
from shoal.ops.model_figures import LATENCY_WINDOW_S
from shoal.ops.percentiles import histogram_delta, percentile_us
from shoal.ops.schema import LlmStats as LlmRow


@dataclass(frozen=True)
class _Reading:
    at: float
    stats: LlmStats


@dataclass
class _Track:
    readings: deque[_Reading] = field(default_factory=deque)


def _went_down(newer: LlmStats, older: LlmStats) -> bool:
    return (newer.generation_tokens < older.generation_tokens
            or newer.prompt_tokens < older.prompt_tokens
            or sum(newer.time_to_first_token) < sum(older.time_to_first_token))


def _rate(newer: int, older: int, seconds: float) -> float:
    return round((newer - older) / seconds, 2) if seconds > 0 and newer >= older else 0.0


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


class LlmFigures:
    """Keeps the readings of the last ``window_s`` per llm version. Single-threaded."""

    def __init__(self, window_s: float = LATENCY_WINDOW_S) -> None:
        self.window_s = window_s
        self._tracks: dict[tuple[str, int], _Track] = {}

    def update(self, at: float, stats: Sequence[ModelStats]) -> list[LlmRow]:
        """The rows of every version in ``stats`` that carries executor figures, at ``at``
        (seconds; only differences are used)."""
        rows: list[LlmRow] = []
        seen: set[tuple[str, int]] = set()
        for model in sorted(stats, key=lambda s: (s.name, s.version)):
            if model.llm is None:
                continue
            key = (model.name, model.version)
            seen.add(key)
            rows.append(self._row(at, key, model.llm))
        for gone in self._tracks.keys() - seen:
            del self._tracks[gone]
        return rows

    def _row(self, at: float, key: tuple[str, int], llm: LlmStats) -> LlmRow:
        track = self._tracks.setdefault(key, _Track())
        if track.readings and _went_down(llm, track.readings[-1].stats):
            track.readings.clear()
        previous = track.readings[-1] if track.readings else None
        now = _Reading(at, llm)
        track.readings.append(now)
        while len(track.readings) > 2 and track.readings[1].at <= at - self.window_s:
            track.readings.popleft()
        oldest = track.readings[0] if track.readings[0] is not now else None
        ttft = histogram_delta(llm.time_to_first_token,
                               oldest.stats.time_to_first_token if oldest else [])
        itl = histogram_delta(llm.inter_token, oldest.stats.inter_token if oldest else [])
        row = LlmRow(
            name=key[0], version=key[1], kv_blocks_used=llm.kv_blocks_used,
            kv_blocks_free=llm.kv_blocks_free, active_requests=llm.active_requests,
            tokens_per_s=0.0, queued_requests=llm.queued_requests,
            kv_blocks_max=llm.kv_blocks_max, kv_blocks_reused=llm.kv_blocks_reused,
            prompt_tokens=llm.prompt_tokens, generation_tokens=llm.generation_tokens,
            window_s=round(at - oldest.at, 1) if oldest else 0.0, first_tokens=sum(ttft),
            ttft_p50_us=_rounded(percentile_us(ttft, 0.5)),
            ttft_p99_us=_rounded(percentile_us(ttft, 0.99)),
            itl_p50_us=_rounded(percentile_us(itl, 0.5)),
            itl_p99_us=_rounded(percentile_us(itl, 0.99)),
            kv_pool_bytes=llm.kv_pool_bytes, weights_bytes=llm.weights_bytes)
        if previous is not None:
            seconds = at - previous.at
            row.tokens_per_s = _rate(llm.generation_tokens, previous.stats.generation_tokens,
                                     seconds)
            row.prompt_tokens_per_s = _rate(llm.prompt_tokens, previous.stats.prompt_tokens,
                                            seconds)
        return row
