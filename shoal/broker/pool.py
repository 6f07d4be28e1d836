"""Worker processes of the broker: spawn, watch, restart with backoff (docs/architecture.md §1).

A ``WorkerHandle`` is one spawn of one model instance. Death is seen through a pidfd registered
in the broker's poller (instant), so a SIGKILLed worker's requests fail at once. Restart delays
follow TorchServe's Fibonacci back-off (0, 1, 1, 2, 3, 5, ... s, capped at 30 s), reset after a
worker has served for ``_HEALTHY_AFTER_S``. There is no last try: an instance that keeps dying
is started again every 30 s for as long as its model is served (``instance_deaths``).
"""

from __future__ import annotations

import enum
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field

import msgspec

from shoal.messages import CustomMetricFamily, LlmStats, WorkerSpec

logger = logging.getLogger(__name__)

_BACKOFF_S = (0.0, 1.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 30.0)
_HEALTHY_AFTER_S = 60.0


class WorkerState(enum.Enum):
    LOADING = "loading"
    IDLE = "idle"
    BUSY = "busy"
    STOPPING = "stopping"
    DEAD = "dead"


@dataclass
class WorkerHandle:
    spec: WorkerSpec
    process: subprocess.Popen[bytes]
    pidfd: int | None
    started_at: float
    state: WorkerState = WorkerState.LOADING
    batch_id: int | None = None
    ready_at: float | None = None
    streams: set[int] = field(default_factory=set)  # exec ids of decoupled requests still open
    heartbeat_at: float | None = None  # broker clock of the last Heartbeat (None: none yet)
    owes_since: float | None = None  # last progress while it owes answers (health.py)
    kill_reason: str = ""  # why the broker killed it (shown in the requests' errors)
    # the models' custom metrics, as its last heartbeat that carried them (they go with it)
    custom_metrics: list[CustomMetricFamily] = field(default_factory=list)
    llm: LlmStats | None = None  # an llm backend's executor figures, as its last heartbeat

    @property
    def identity(self) -> str:
        return self.spec.identity

    @property
    def pid(self) -> int:
        return self.process.pid

    def exit_description(self) -> str:
        if self.kill_reason:
            return f"was killed: {self.kill_reason}"
        code = self.process.poll()
        if code is None:
            return "still running"
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with code {code}"

    def close_pidfd(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def spawn_worker(spec: WorkerSpec, now: float) -> WorkerHandle:
    """Start ``python -m shoal.workers <spec>`` (a fresh interpreter: no inherited sockets)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "shoal.workers", msgspec.json.encode(spec).decode()],
        stdin=subprocess.DEVNULL, close_fds=True,
    )
    try:
        pidfd: int | None = os.pidfd_open(process.pid)
    except (AttributeError, OSError):
        pidfd = None
    logger.info("spawned worker %s (pid %d) for model %s version %d", spec.instance_name,
                process.pid, spec.model_name, spec.model_version)
    return WorkerHandle(spec=spec, process=process, pidfd=pidfd, started_at=now)


def restart_delay(failures: int, served_for: float) -> float:
    """Delay before the next spawn after ``failures`` consecutive deaths."""
    if served_for >= _HEALTHY_AFTER_S:
        return 0.0
    return _BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)]


def reap(handle: WorkerHandle, timeout: float = 0.0) -> bool:
    """True when the process has exited (and was waited for)."""
    try:
        handle.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    handle.close_pidfd()
    return True
