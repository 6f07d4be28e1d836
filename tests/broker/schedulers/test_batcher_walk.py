"""The dynamic batcher keeps its walk over the queue between calls (extended when a request is
appended, redone after any other change). Over random workloads with priority levels, shape
changes, timeouts (REJECT and DELAY), cancels and batches, the kept walk always equals a walk
done afresh over the queue as it is."""

from __future__ import annotations

import random

import pytest

from shoal.broker.schedulers.dynamic import DynamicBatcher, DynamicBatcherConfig, QueuePolicy, _Walk

from .helpers import request


def fresh_walk(batcher: DynamicBatcher) -> _Walk:
    walk = _Walk(changes=0)
    for queued in batcher._queue:  # the queue as it is now, in service order
        walk.step(queued, batcher._max_batch_rows, batcher._max_preferred, batcher._preferred)
    return walk


def fields(walk: _Walk) -> tuple[object, ...]:
    return (walk.signature, walk.rows, walk.count, walk.best_count, walk.stopped, walk.oldest)


@pytest.mark.parametrize("seed", range(20))
def test_kept_walk_equals_a_fresh_walk(seed: int) -> None:
    rng = random.Random(seed)
    batcher = DynamicBatcher(DynamicBatcherConfig(
        max_batch_size=8, preferred_batch_sizes=(4, 6), max_queue_delay_us=5_000,
        priority_levels=2, default_priority_level=2,
        default_policy=QueuePolicy(timeout_action=rng.choice(["REJECT", "DELAY"]),
                                   default_timeout_us=3_000, allow_timeout_override=True,
                                   max_queue_size=12)))
    now = 0.0
    queued: list[int] = []
    for n in range(400):
        now += rng.choice([0.0, 0.0005, 0.002])
        op = rng.random()
        if op < 0.6:
            r = request(n, rows=rng.choice([1, 1, 2, 3]), at=now, priority=rng.choice([0, 1, 2]),
                        timeout_us=rng.choice([0, 1_000]), signature=rng.choice(["a", "a", "b"]))
            if batcher.submit(r, now) is None:
                queued.append(n)
        elif op < 0.75:
            batcher.next_batch(now)
        elif op < 0.85 and queued:
            batcher.cancel((b"fe", queued.pop(rng.randrange(len(queued)))))
        else:
            batcher.expire(now)
        batcher.next_deadline(now)  # the loop asks after every event: the walk is kept
        assert fields(batcher._current_walk()) == fields(fresh_walk(batcher)), n
