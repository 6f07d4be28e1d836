"""Sum the executor figures of a version's llm instances into one ``LlmStats``.

Each live worker of an ``llm``-backend model reports its own executor's figures on its heartbeat
(``WorkerHandle.llm``). A version's figures are the sum over its instances: every instance has
its own executor, KV pool and weights, so counters, gauges, bytes and histogram buckets all add
up. ``kv_tokens_per_block`` is the same in every instance of a version (one config) and is taken,
not summed. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from shoal.messages import LlmStats

_TAKEN = frozenset({"kv_tokens_per_block"})
_HISTOGRAMS = ("time_to_first_token", "inter_token", "input_token_len", "output_token_len")


def _add_counts(a: list[int], b: list[int]) -> list[int]:
    if not a:
        return list(b)
    if not b:
        return list(a)
    return [x + y for x, y in zip(a, b, strict=True)]


def sum_llm_stats(reported: Iterable[LlmStats | None]) -> LlmStats | None:
    """The sum of the ``reported`` figures (None entries skipped); None when there are none."""
    present = [stats for stats in reported if stats is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    fields: dict[str, object] = {}  # every field of LlmStats, by name
    for name in LlmStats.__struct_fields__:
        values = [getattr(stats, name) for stats in present]
        if name in _TAKEN:
            fields[name] = values[0]
        elif name in _HISTOGRAMS:
            counts: list[int] = []
            for value in values:
                counts = _add_counts(counts, value)
            fields[name] = counts
        else:
            fields[name] = sum(values)
    return msgspec.structs.replace(present[0], **fields)
