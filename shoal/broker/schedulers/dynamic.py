"""Triton's dynamic batcher (core ``src/dynamic_batch_scheduler.cc``, ``GetDynamicBatch``) as a
pure state machine over an injected clock.

Batch formation, when an instance is idle: walk the queue in service order (priority level, then
arrival), adding requests while the rows fit ``max_batch_size`` and the ``shape_signature``
equals the first request's; the walk never skips a request (FIFO). Along the walk remember the
*best* prefix: the last one whose rows equal a preferred size, or, when the next request would
take the rows past the largest preferred size before any preferred size was met, the prefix
before it. Then, with ``delay`` the queue delay and ``oldest`` the earliest arrival in the walk:

1. a best prefix exists and ``oldest + delay`` has not passed -> send the best prefix now;
2. the walk stopped early (max_batch_size or a shape change), or its rows reach the largest
   preferred size, or ``oldest + delay`` has passed, or delay is 0 -> send the whole walk now;
3. otherwise wait until ``oldest + delay`` (or an earlier queue timeout) -- unless the adaptive
   delay is on and ``arrivals.ArrivalEstimate`` says no partner will come within the delay: send the
   whole walk now (the delay is a maximum, not a promise to wait).

So with preferred sizes [4, 8] and five rows queued, Triton sends 4 at once; when the delay has
passed it sends everything that fits instead, even if that is not a preferred size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shoal.broker.schedulers.arrivals import ArrivalEstimate
from shoal.broker.schedulers.base import QueuedRequest, Rejection, RequestKey
from shoal.broker.schedulers.priority_queue import PriorityQueue, QueuePolicy, TimeoutAction
from shoal.errors import ShoalError, invalid_arg

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

__all__ = ["DynamicBatcher", "DynamicBatcherConfig", "QueuePolicy", "TimeoutAction"]


@dataclass(frozen=True)
class DynamicBatcherConfig:
    """``ModelConfig.dynamic_batching`` plus ``max_batch_size`` (0: the model does not batch;
    every batch is then one request, still subject to priorities and queue policies)."""

    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...] = ()  # ascending; empty means (max_batch_size,)
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_policy: QueuePolicy = field(default_factory=QueuePolicy)
    priority_policies: dict[int, QueuePolicy] = field(default_factory=dict)
    # send at once instead of waiting when no partner is expected in time (arrivals.py); off
    # here, on by default for a model config (``from_model_config``)
    adaptive_delay: bool = False

    def __post_init__(self) -> None:
        _validate(self)

    @classmethod
    def from_model_config(cls, config: ModelConfig) -> DynamicBatcherConfig:
        """Read ``config.dynamic_batching`` (defaults when unset) and ``config.max_batch_size``.
        Raises ShoalError(INVALID_ARG) with Triton's validation messages."""
        batching = config.dynamic_batching
        try:
            return cls(
                max_batch_size=int(config.max_batch_size),
                preferred_batch_sizes=tuple(sorted(set(batching.preferred_batch_size))),
                max_queue_delay_us=int(batching.max_queue_delay_microseconds),
                preserve_ordering=bool(batching.preserve_ordering),
                priority_levels=int(batching.priority_levels),
                default_priority_level=int(batching.default_priority_level),
                default_policy=_policy_from_proto(batching.default_queue_policy),
                priority_policies={
                    int(level): _policy_from_proto(policy)
                    for level, policy in batching.priority_queue_policy.items()
                },
                adaptive_delay=adaptive_delay_parameter(config),
            )
        except ShoalError as error:
            raise invalid_arg(f"{error.message} for {config.name}") from None


ADAPTIVE_DELAY_PARAMETER = "shoal_adaptive_queue_delay"


def adaptive_delay_parameter(config: ModelConfig) -> bool:
    """The model parameter ``shoal_adaptive_queue_delay``: "true" (the default when absent) or
    "false" (wait for the whole queue delay as Triton does)."""
    parameter = config.parameters.get(ADAPTIVE_DELAY_PARAMETER)
    if parameter is None:
        return True
    value = str(parameter.string_value).strip().lower()
    if value not in ("true", "false"):
        raise invalid_arg(f"parameter {ADAPTIVE_DELAY_PARAMETER} must be 'true' or 'false', "
                          f"got '{parameter.string_value}'")
    return value == "true"


def _policy_from_proto(policy: Any) -> QueuePolicy:
    """``inference.ModelQueuePolicy`` -> QueuePolicy (timeout_action: REJECT = 0, DELAY = 1)."""
    return QueuePolicy(
        timeout_action="DELAY" if policy.timeout_action == 1 else "REJECT",
        default_timeout_us=int(policy.default_timeout_microseconds),
        allow_timeout_override=bool(policy.allow_timeout_override),
        max_queue_size=int(policy.max_queue_size),
    )


def _validate(config: DynamicBatcherConfig) -> None:
    """Triton's ValidateModelConfig checks for ``dynamic_batching`` (messages without the
    trailing "for <model>", which ``from_model_config`` adds)."""
    if config.max_batch_size < 0:
        raise invalid_arg("'max_batch_size' must be non-negative value")
    for size in config.preferred_batch_sizes:
        if size <= 0:
            raise invalid_arg("dynamic batching preferred size must be positive")
        if size > config.max_batch_size:
            raise invalid_arg("dynamic batching preferred size must be <= max batch size")
    if config.max_queue_delay_us < 0:
        raise invalid_arg("dynamic batching max_queue_delay_microseconds must be non-negative")
    levels = config.priority_levels
    if levels != 0:
        if not 1 <= config.default_priority_level <= levels:
            raise invalid_arg(f"default priority level must be in range [1, {levels}]")
        if any(not 1 <= level <= levels for level in config.priority_policies):
            raise invalid_arg(
                f"priority queue policy must have priority level in range [1, {levels}]"
            )
    if config.preserve_ordering:
        if levels > 1:
            raise invalid_arg("Only one priority level is allowed when 'preserve_ordering' is true")
        policies = [config.default_policy, *config.priority_policies.values()]
        if any(p.default_timeout_us != 0 and p.timeout_action == "DELAY" for p in policies):
            raise invalid_arg(
                "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true"
            )


@dataclass(slots=True)
class _Walk:
    """GetDynamicBatch's walk over the queue in service order (see the module docstring), which
    does not depend on the clock: ``count`` requests of ``rows`` rows fit, the best prefix is
    ``best_count`` requests (0: none), ``oldest`` is their earliest arrival, and ``stopped`` says
    the walk stopped before the queue's end. ``changes``: the queue's change counter it is
    current for. A request appended at the end of the service order extends it (``step``)."""

    changes: int
    signature: object = None
    rows: int = 0
    count: int = 0
    best_count: int = 0
    stopped: bool = False
    oldest: float = float("inf")

    def step(self, request: QueuedRequest, max_rows: int, max_preferred: int,
             preferred: frozenset[int]) -> None:
        """Walk on to the next request in service order (no-op once stopped)."""
        if self.stopped:
            return
        rows = self.rows
        request_rows = request.rows
        if self.count == 0:
            self.signature = request.shape_signature
        else:
            if self.best_count == 0 and rows + request_rows > max_preferred:
                self.best_count = self.count
            if rows + request_rows > max_rows or request.shape_signature != self.signature:
                self.stopped = True
                return
        self.rows = rows = rows + request_rows
        self.count += 1
        if request.arrival < self.oldest:
            self.oldest = request.arrival
        if rows in preferred:
            self.best_count = self.count


@dataclass(frozen=True, slots=True)
class _Plan:
    """What ``next_batch`` would do now: send the first ``send_count`` queued requests, or
    (send_count == 0) wait until ``wait_until`` (None: nothing is queued)."""

    send_count: int
    wait_until: float | None = None


class DynamicBatcher:
    """Implements ``Scheduler``. Not thread-safe: the broker loop is its only caller.

    Requests rejected by a timeout while ``next_batch`` prepared a batch are kept until the next
    ``expire`` returns them (``next_deadline`` then reports them as due now).
    """

    def __init__(self, config: DynamicBatcherConfig) -> None:
        self.config = config
        self._max_batch_rows = max(1, config.max_batch_size)
        self._preferred = frozenset(config.preferred_batch_sizes or (self._max_batch_rows,))
        self._max_preferred = max(self._preferred)
        self._delay_s = config.max_queue_delay_us / 1e6
        self._queue = PriorityQueue(
            config.default_policy,
            config.priority_levels,
            config.default_priority_level,
            config.priority_policies,
        )
        self._timed_out: list[Rejection] = []
        self._arrivals = (ArrivalEstimate(self._delay_s)
                          if config.adaptive_delay and self._delay_s > 0 else None)
        # the walk of the current queue, kept between calls: under load the broker asks for a
        # plan several times per loop pass and the queue holds up to a batch or more
        self._walk = _Walk(changes=-1)

    def submit(self, request: QueuedRequest, now: float) -> Rejection | None:
        if self._arrivals is not None:
            self._arrivals.observe(now, request.in_flight)
        walk, queue = self._walk, self._queue
        current = walk.changes == queue.changes
        rejection = queue.enqueue(request)
        if current and rejection is None and queue.last() is request:
            walk.step(request, self._max_batch_rows, self._max_preferred, self._preferred)
            walk.changes = queue.changes
        return rejection

    def next_batch(self, now: float) -> list[QueuedRequest] | None:
        self._timed_out.extend(self._queue.apply_timeouts(now))
        plan = self._plan(now)
        if plan.send_count == 0:
            return None
        return self._queue.pop_front(plan.send_count)

    def has_batch(self, now: float) -> bool:
        """May say yes for a batch whose requests time out first (next_batch then gives None)."""
        return self._plan(now).send_count > 0

    def expire(self, now: float) -> list[Rejection]:
        rejections = self._timed_out + self._queue.apply_timeouts(now)
        self._timed_out = []
        return rejections

    def next_deadline(self, now: float) -> float | None:
        if self._timed_out:
            return now
        deadlines = [self._queue.earliest_timeout(), self._plan(now).wait_until]
        return min((d for d in deadlines if d is not None), default=None)

    def cancel(self, key: RequestKey) -> QueuedRequest | None:
        return self._queue.remove(key)

    def drain(self) -> list[QueuedRequest]:
        return self._queue.drain()

    def pending_count(self) -> int:
        return len(self._queue)

    def pending_rows(self) -> int:
        return self._queue.rows

    def _current_walk(self) -> _Walk:
        walk = self._walk
        if walk.changes != self._queue.changes:
            walk = self._walk = _Walk(changes=self._queue.changes)
            for request in self._queue:
                walk.step(request, self._max_batch_rows, self._max_preferred, self._preferred)
                if walk.stopped:
                    break
        return walk

    def _plan(self, now: float) -> _Plan:
        """GetDynamicBatch for an idle instance (an empty payload). See the module docstring."""
        walk = self._current_walk()
        count, rows, best_count, stopped_early = (walk.count, walk.rows, walk.best_count,
                                                  walk.stopped)
        if count == 0:
            return _Plan(0)
        delay_deadline = walk.oldest + self._delay_s
        delay_passed = self._delay_s > 0 and now >= delay_deadline
        if best_count and not delay_passed:
            return _Plan(best_count)
        if stopped_early or rows >= self._max_preferred or delay_passed or self._delay_s == 0:
            return _Plan(count)
        if self._arrivals is not None and self._arrivals.partner_unlikely():
            return _Plan(count)
        return _Plan(0, delay_deadline)
