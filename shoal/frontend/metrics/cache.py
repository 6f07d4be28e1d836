"""Triton's per-model response-cache metric families (``nv_cache_*_per_model``), for the model
versions whose config enables the cache, when the server has a cache (``--cache-config``).
Figures from the broker's statistics: every frontend's cache, summed. Durations in µs."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Final

from prometheus_client.metrics_core import Metric

from shoal.frontend.metrics.exposition import counter_family
from shoal.frontend.metrics.families import version_labels
from shoal.messages import ModelStats, RepositorySnapshot

_CACHE: Final[tuple[tuple[str, str, Callable[[ModelStats], int]], ...]] = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model",
     lambda s: s.cache_hit.count),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model",
     lambda s: s.cache_miss.count),
    ("nv_cache_hit_duration_per_model",
     "Total cache hit duration per model, in microseconds", lambda s: s.cache_hit.ns // 1000),
    ("nv_cache_miss_duration_per_model",
     "Total cache miss (insert+lookup) duration per model, in microseconds",
     lambda s: s.cache_miss.ns // 1000),
)


def cache_families(stats: Sequence[ModelStats], snapshot: RepositorySnapshot | None
                   ) -> Iterator[Metric]:
    """One family per figure; a series per version with ``response_cache`` enabled."""
    enabled = {(i.name, i.version) for i in snapshot.models if i.response_cache} \
        if snapshot is not None else set()
    shown = sorted((s for s in stats if (s.name, s.version) in enabled),
                   key=lambda s: (s.name, s.version))
    for name, text, value in _CACHE:
        family = counter_family(name, text)
        for s in shown:
            family.add_sample(name, version_labels(s), value(s))
        yield family
