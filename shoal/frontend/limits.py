"""The frontend process's file-descriptor budget, and a rate-limited warning for limits that trip.

Every accepted connection holds a descriptor until it closes. A process at its RLIMIT_NOFILE
cannot accept, and the event loop (libuv) then accepts and closes new connections at once,
without telling anyone: health checks are reset along with everything else. So at start the
frontend raises its soft limit to the hard limit (``raise_descriptor_limit``) and splits what it
got (``plan_descriptor_budget``): a fixed reserve for the process's own files, registered client
shm regions, the metrics port and the over-cap connections that still get an answer (503, or
200 for a health check); the rest is shared by the HTTP and gRPC connection caps. With the
defaults and a hard limit of 16,000 or more nothing is scaled down.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from shoal.settings import FrontendSettings

logger = logging.getLogger(__name__)

BASE_RESERVE: Final = 256          # the process's own descriptors: sockets, segments, logs
OVER_CAP_CONNECTIONS: Final = 128  # connections past the HTTP cap answered at once (503/health)
METRICS_CONNECTIONS: Final = 64    # cap of the metrics port (frontend 0)
MIN_CONNECTIONS: Final = 16        # a cap is never scaled below this


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise RLIMIT_NOFILE's soft limit to the hard limit; returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == hard:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        logger.warning("could not raise the file-descriptor limit from %d to %d: %s",
                       soft, hard, exc)
        return soft, soft
    return soft, hard


@dataclass(frozen=True)
class DescriptorBudget:
    limit: int              # RLIMIT_NOFILE (soft) of the process
    http_connections: int   # open HTTP connections before new ones get 503
    grpc_connections: int   # open gRPC connections before new ones are closed
    over_cap: int           # HTTP connections past the cap answered at once (more are closed)
    metrics_connections: int
    reserved: int           # kept for everything that is not a client connection
    scaled: bool            # the caps asked for did not fit and were scaled down


def plan_descriptor_budget(limit: int, settings: FrontendSettings, serves_metrics: bool
                           ) -> DescriptorBudget:
    """Split ``limit`` descriptors. The caps asked for are kept when they fit; otherwise the
    room left after the reserve is shared in proportion (each at least MIN_CONNECTIONS)."""
    metrics = METRICS_CONNECTIONS if serves_metrics else 0
    shm = settings.client_shm.max_regions if settings.client_shm.allowed else 0
    reserved = BASE_RESERVE + OVER_CAP_CONNECTIONS + metrics + shm
    http = settings.http.max_connections
    grpc = settings.grpc.max_connections if settings.grpc.enabled else 0
    room = limit - reserved
    scaled = http + grpc > room
    if scaled:
        room = max(room, 2 * MIN_CONNECTIONS)
        http_share = max(MIN_CONNECTIONS, room * http // (http + grpc))
        grpc = max(MIN_CONNECTIONS, room - http_share) if grpc else 0
        http = http_share
    return DescriptorBudget(limit=limit, http_connections=http, grpc_connections=grpc,
                            over_cap=OVER_CAP_CONNECTIONS, metrics_connections=metrics,
                            reserved=reserved, scaled=scaled)


def log_descriptor_budget(before: int, budget: DescriptorBudget,
                          settings: FrontendSettings) -> None:
    """One line at start: the limit in force and the caps; a warning when caps were scaled."""
    raised = f" (raised from {before})" if before != budget.limit else ""
    logger.info("file descriptors: limit %d%s; HTTP connections capped at %d, gRPC at %d, "
                "%d kept for the process, client shm, metrics and over-cap answers",
                budget.limit, raised, budget.http_connections, budget.grpc_connections,
                budget.reserved)
    if budget.scaled:
        logger.warning(
            "the file-descriptor limit %d is too low for --http-max-connections=%d and "
            "--grpc-max-connections=%d: capped at %d and %d (raise the hard limit: ulimit -Hn, "
            "systemd LimitNOFILE=, docker --ulimit nofile=)", budget.limit,
            settings.http.max_connections, settings.grpc.max_connections,
            budget.http_connections, budget.grpc_connections)


class RateLimitedWarning:
    """A warning logged at most once per ``interval_s``; the events in between are counted
    and reported with the next line. Single-threaded (the event loop)."""

    def __init__(self, log: logging.Logger, interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._interval_s = interval_s
        self._clock = clock
        self._next_at = 0.0
        self._suppressed = 0

    def __call__(self, message: str, *args: object) -> None:
        now = self._clock()
        if now < self._next_at:
            self._suppressed += 1
            return
        self._next_at = now + self._interval_s
        if self._suppressed:
            message += f" ({self._suppressed} more since the last such line)"
            self._suppressed = 0
        self._log.warning(message, *args)
