"""Priority levels with per-level queue policies: Triton's ``PriorityQueue`` / ``PolicyQueue``
(core ``src/scheduler_utils.cc``), driven by an injected clock.

Service order: levels ascending (1 is the highest priority; level 0 exists only when the model has
no priority levels); within a level, unexpired requests first in arrival order, then the requests
that timed out under a DELAY policy, in the order they timed out.

Timeouts are applied eagerly (``apply_timeouts`` looks at every queued request through a heap of
deadlines), where Triton looks only at the requests its batch cursor passes; the outcome for any
one request is the same, but a rejected client hears about it at its deadline.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from shoal.broker.schedulers.base import QueuedRequest, Rejection, RequestKey, queue_full, timed_out

TimeoutAction = Literal["REJECT", "DELAY"]

# Compact the deadline heap once stale entries outnumber live ones by this factor (and it is big).
_HEAP_SLACK = 2
_HEAP_MIN_COMPACT = 64


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """``inference.ModelQueuePolicy``. ``max_queue_size`` counts the requests of one priority
    level, delayed ones included; 0 = unbounded. Timeouts are in microseconds; 0 = none."""

    timeout_action: TimeoutAction = "REJECT"
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    def timeout_us_for(self, request_timeout_us: int) -> int:
        """Triton's rule (PolicyQueue::Enqueue): the default timeout, unless overriding is allowed
        and the request asks for a non-zero timeout *shorter* than the default. A request can
        therefore never set a timeout when the level's default is 0 (none)."""
        if self.allow_timeout_override and 0 < request_timeout_us < self.default_timeout_us:
            return request_timeout_us
        return self.default_timeout_us


@dataclass(eq=False, slots=True)
class _Entry:
    request: QueuedRequest
    level: int
    seq: int
    # Seconds on the broker clock; None once the request is delayed, left the queue, or never
    # had a timeout. The heap holds stale tuples for entries whose deadline became None.
    deadline: float | None
    delayed: bool = False  # in its level's delayed deque (timed out under DELAY)


class _Level:
    __slots__ = ("active", "delayed", "policy")

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self.active: deque[_Entry] = deque()
        self.delayed: deque[_Entry] = deque()

    def size(self) -> int:
        return len(self.active) + len(self.delayed)


class PriorityQueue:
    """Owns the queued requests of one scheduler. Not thread-safe."""

    def __init__(
        self,
        default_policy: QueuePolicy,
        priority_levels: int = 0,
        default_priority_level: int = 0,
        level_policies: Mapping[int, QueuePolicy] | None = None,
    ) -> None:
        self._default_policy = default_policy
        self._priority_levels = priority_levels
        self._default_level = default_priority_level if priority_levels > 0 else 0
        self._level_policies = dict(level_policies or {}) if priority_levels > 0 else {}
        self._levels: dict[int, _Level] = {}
        self._level_order: list[int] = []  # keys of _levels, ascending; empty levels are erased
        self._by_key: dict[RequestKey, _Entry] = {}
        self._rows = 0
        self._seq = 0
        self._deadlines: list[tuple[float, int, _Entry]] = []
        self._timed_count = 0  # entries whose deadline is not None
        # bumped by every change to the queue's contents or order: a reader's cached view of it
        # (the dynamic batcher's walk) is current while this is unchanged
        self.changes = 0

    def __len__(self) -> int:
        return len(self._by_key)

    def __iter__(self) -> Iterator[QueuedRequest]:
        """Queued requests in service order. Do not modify the queue while iterating."""
        for level_number in self._level_order:
            level = self._levels[level_number]
            for entry in level.active:
                yield entry.request
            for entry in level.delayed:
                yield entry.request

    @property
    def rows(self) -> int:
        return self._rows

    def last(self) -> QueuedRequest | None:
        """The last queued request in service order (None: the queue is empty)."""
        if not self._level_order:
            return None
        level = self._levels[self._level_order[-1]]
        return (level.delayed or level.active)[-1].request

    def level_of(self, priority: int) -> int:
        """Triton's InferenceRequest::SetPriority: 0 or out of range -> the default level."""
        if priority <= 0 or priority > self._priority_levels:
            return self._default_level
        return priority

    def enqueue(self, request: QueuedRequest) -> Rejection | None:
        if request.key in self._by_key:
            raise ValueError(f"request {request.key!r} is already queued")
        level_number = self.level_of(request.priority)
        level = self._levels.get(level_number)
        policy = level.policy if level is not None else self._policy_of(level_number)
        if policy.max_queue_size and (level.size() if level is not None else 0
                                      ) >= policy.max_queue_size:
            return queue_full(request)
        if level is None:
            level = self._levels[level_number] = _Level(policy)
            bisect.insort(self._level_order, level_number)
        # no default timeout: no request can set one (timeout_us_for)
        timeout_us = (policy.timeout_us_for(request.timeout_us) if policy.default_timeout_us
                      else 0)
        deadline = request.arrival + timeout_us / 1e6 if timeout_us else None
        entry = _Entry(request, level_number, self._seq, deadline)
        self._seq += 1
        self.changes += 1
        level.active.append(entry)
        self._by_key[request.key] = entry
        self._rows += request.rows
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, entry.seq, entry))
            self._timed_count += 1
        return None

    def apply_timeouts(self, now: float) -> list[Rejection]:
        """Apply each level's policy to the requests whose deadline is at or before ``now``:
        REJECT removes them (returned, in arrival order); DELAY moves them behind the unexpired
        requests of their level, where they stay without a timeout."""
        expired: list[_Entry] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, entry = heapq.heappop(self._deadlines)
            if entry.deadline is not None:
                expired.append(entry)
        if not expired:
            return []
        self.changes += 1
        expired.sort(key=lambda e: e.seq)
        rejections: list[Rejection] = []
        for entry in expired:
            self._clear_deadline(entry)
            level = self._levels[entry.level]
            level.active.remove(entry)
            if level.policy.timeout_action == "DELAY":
                entry.delayed = True
                level.delayed.append(entry)
            else:
                self._forget(entry)
                rejections.append(timed_out(entry.request))
        return rejections

    def earliest_timeout(self) -> float | None:
        """The earliest deadline of a queued, not yet delayed request."""
        while self._deadlines and self._deadlines[0][2].deadline is None:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    def pop_front(self, count: int) -> list[QueuedRequest]:
        """Remove and return the first ``count`` requests in service order."""
        taken: list[QueuedRequest] = []
        self.changes += 1
        by_key = self._by_key
        while count > 0 and self._level_order:
            level_number = self._level_order[0]
            level = self._levels[level_number]
            while count > 0 and (level.active or level.delayed):
                entry = level.active.popleft() if level.active else level.delayed.popleft()
                if entry.deadline is not None:
                    self._clear_deadline(entry)
                request = entry.request
                del by_key[request.key]
                self._rows -= request.rows
                taken.append(request)
                count -= 1
            if not level.active and not level.delayed:  # as _forget: empty levels are erased
                del self._levels[level_number]
                self._level_order.remove(level_number)
        return taken

    def remove(self, key: RequestKey) -> QueuedRequest | None:
        entry = self._by_key.get(key)
        if entry is None:
            return None
        self.changes += 1
        level = self._levels[entry.level]
        (level.delayed if entry.delayed else level.active).remove(entry)
        self._clear_deadline(entry)
        self._forget(entry)
        return entry.request

    def drain(self) -> list[QueuedRequest]:
        drained = list(self)
        self.changes += 1
        self._levels.clear()
        self._level_order.clear()
        self._by_key.clear()
        self._deadlines.clear()
        self._rows = 0
        self._timed_count = 0
        return drained

    def _policy_of(self, level_number: int) -> QueuePolicy:
        return self._level_policies.get(level_number, self._default_policy)

    def _clear_deadline(self, entry: _Entry) -> None:
        if entry.deadline is None:
            return
        entry.deadline = None
        self._timed_count -= 1
        heap_size = len(self._deadlines)
        if heap_size > _HEAP_MIN_COMPACT and heap_size > _HEAP_SLACK * self._timed_count:
            self._deadlines = [item for item in self._deadlines if item[2].deadline is not None]
            heapq.heapify(self._deadlines)

    def _forget(self, entry: _Entry) -> None:
        """Drop a request that has already been taken out of its level's deques."""
        del self._by_key[entry.request.key]
        self._rows -= entry.request.rows
        level = self._levels[entry.level]
        if level.size() == 0:
            del self._levels[entry.level]
            self._level_order.remove(entry.level)
