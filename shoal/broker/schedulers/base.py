"""The contract between the broker loop and its schedulers (docs/architecture.md §5).

A scheduler is a pure, synchronous state machine. The broker passes the clock in (``now``: seconds
on the broker's monotonic clock, the same clock that stamps ``QueuedRequest.arrival``) and does all
I/O; a scheduler never sleeps, logs, or touches a socket.

Ownership: a request belongs to the scheduler from a ``submit`` that returned ``None`` until it
leaves through exactly one of ``next_batch``, ``expire``, ``cancel`` or ``drain``; whichever returns
it hands it back to the broker, which then ends or runs it. A rejected ``submit`` never entered.

How the broker drives one scheduler:

    on a new request:   rejection = scheduler.submit(request, now)   # not None: reply with it
    on every wake-up:   for rejection in scheduler.expire(now): reply with it
                        while an instance is idle and (batch := scheduler.next_batch(now)):
                            dispatch batch to that instance
    then sleep until    scheduler.next_deadline(now)  (None: until the next message)

A batch that is ready now is not a deadline: ``next_deadline`` only names times at which the
passage of time alone changes the scheduler's answers (a queue delay running out, a queue timeout).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Final, Protocol

from shoal.errors import ErrorCode

RequestKey = tuple[bytes, int]
"""(frontend identity, request id): opaque and hashable; unique among queued requests."""

QUEUE_FULL_MESSAGE: Final = "Exceeds maximum queue size"
TIMEOUT_MESSAGE: Final = "Request timeout expired"


@dataclass(slots=True)
class QueuedRequest:
    """What a scheduler needs to know about one inference request; the tensors stay elsewhere.
    Immutable by contract (``dataclasses.replace`` makes a changed copy), not ``frozen``: the
    broker builds one per request and a frozen dataclass costs several times as much to build.

    ``batch_size``: rows along the batch dimension (1 for a model without batching).
    ``arrival``: broker clock, seconds; the queue delay and the queue timeout count from it.
    ``priority``: the request's ``priority`` parameter; 0 means the model's default level, 1 is
    the highest. ``timeout_us``: the request's ``timeout`` parameter in microseconds; 0 = none.
    ``shape_signature``: requests are batched together only when theirs are equal (non-batch
    dims of inputs whose shapes must match, dtypes). ``in_flight``: other requests of the model
    version queued or executing when this one arrived (the adaptive queue delay's evidence).
    """

    key: RequestKey
    batch_size: int
    arrival: float
    priority: int = 0
    timeout_us: int = 0
    shape_signature: Hashable = ()
    in_flight: int = 0

    @property
    def rows(self) -> int:
        """Rows this request adds to a batch (never less than 1, as Triton counts)."""
        return max(1, self.batch_size)


@dataclass(frozen=True, slots=True)
class Rejection:
    """A request that left the scheduler without running; the broker answers it with this error."""

    request: QueuedRequest
    code: ErrorCode
    message: str


def queue_full(request: QueuedRequest) -> Rejection:
    return Rejection(request, ErrorCode.UNAVAILABLE, QUEUE_FULL_MESSAGE)


def timed_out(request: QueuedRequest) -> Rejection:
    return Rejection(request, ErrorCode.UNAVAILABLE, TIMEOUT_MESSAGE)


class Scheduler(Protocol):
    """One per model version. Not thread-safe: only the broker loop calls it."""

    def submit(self, request: QueuedRequest, now: float) -> Rejection | None:
        """Queue ``request``, or return why it cannot be queued (it then never entered).
        Raises ValueError if a request with the same key is already queued (a broker bug)."""
        ...

    def next_batch(self, now: float) -> list[QueuedRequest] | None:
        """Called when an instance is idle: the requests to run on it now, in dispatch order,
        or None (nothing to run yet; ask again at ``next_deadline`` or on the next submit)."""
        ...

    def has_batch(self, now: float) -> bool:
        """Whether ``next_batch(now)`` would return a batch, without taking it (the rate
        limiter stages an instance only then)."""
        ...

    def expire(self, now: float) -> list[Rejection]:
        """Requests whose queue timeout has passed and whose policy is to reject them."""
        ...

    def next_deadline(self, now: float) -> float | None:
        """The earliest time at which ``next_batch`` or ``expire`` may answer differently without
        any new submit; at or before ``now`` means "call them now"; None means no such time."""
        ...

    def cancel(self, key: RequestKey) -> QueuedRequest | None:
        """Remove a queued request (client cancel / disconnect); None if it is not queued."""
        ...

    def drain(self) -> list[QueuedRequest]:
        """Remove every queued request, in dispatch order (unload, shutdown)."""
        ...

    def pending_count(self) -> int: ...

    def pending_rows(self) -> int: ...
