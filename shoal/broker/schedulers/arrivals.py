"""The adaptive queue delay's evidence: will a partner request arrive before the delay runs out?

``max_queue_delay_microseconds`` is a maximum, not a promise to wait. The dynamic batcher asks
``ArrivalEstimate.partner_unlikely`` before it waits for more requests on an idle instance; when
the answer is yes it sends what it has at once. Two exponentially weighted moving averages
(EWMA) over the arrivals of one model version decide:

- ``mean_gap``: the time between consecutive arrivals (each sample capped at ``4 x delay``, so a
  long idle period counts as "slow" without taking a hundred arrivals to be forgotten). No partner
  is expected when the mean gap is longer than the whole delay (fewer than one partner per delay
  on average). It is not compared with the wait that is left: under load that would cut every
  wait short near its end and shrink the batches.
- ``overlap``: the fraction of arrivals that found another request of the version queued or
  executing. A closed-loop client (one request at a time, the next sent when the answer is back)
  arrives at an empty system every time: waiting can never bring it a partner, however short its
  round trip, so an overlap under one half means "do not wait".

Cold start: both averages start at "partners come" (overlap 1, gap 0), so a fresh model waits as
Triton does until lone arrivals show otherwise (with ``ALPHA`` 0.1 the seventh in a row is
sent at once); under load the overlap stays near 1 and the batcher waits exactly as before.
Pure: the clock is passed in.
"""

from __future__ import annotations

from typing import Final

ALPHA: Final = 0.1           # weight of the newest sample in both averages
OVERLAP_THRESHOLD: Final = 0.5
GAP_CAP_DELAYS: Final = 4.0  # a gap sample counts at most this many queue delays


class ArrivalEstimate:
    """Per model version; only the broker loop calls it (not thread-safe)."""

    def __init__(self, delay_s: float) -> None:
        self._delay_s = delay_s
        self._gap_cap = GAP_CAP_DELAYS * delay_s
        self._last_arrival: float | None = None
        self.mean_gap = 0.0
        self.overlap = 1.0

    def observe(self, now: float, in_flight: int) -> None:
        """A request arrived at ``now`` (seconds) and found ``in_flight`` other requests of the
        version queued or executing."""
        if self._last_arrival is not None:
            gap = min(max(0.0, now - self._last_arrival), self._gap_cap)
            self.mean_gap += ALPHA * (gap - self.mean_gap)
        self._last_arrival = now
        self.overlap += ALPHA * ((1.0 if in_flight > 0 else 0.0) - self.overlap)

    def partner_unlikely(self) -> bool:
        """True when no further request is expected within the queue delay, so waiting for one
        would only add latency."""
        return self.overlap < OVERLAP_THRESHOLD or self.mean_gap > self._delay_s
