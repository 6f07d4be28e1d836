"""The broker process entry: ``python -m shoal.broker <BrokerSettings JSON> <status fd>``.

Stops on STOP_SIGNAL (SIGUSR1) from the supervisor, or from the kernel when the supervisor
dies. After the supervisor's death the frontends drain at the same moment as the broker is told
to stop, so the broker first serves on (``drain``) until nothing is in flight, bounded by
--exit-timeout-secs, and only then stops the workers: open decoupled streams finish as they do
on SIGTERM (where the supervisor stops the frontends first and the broker after them).
Tells the supervisor through the status pipe once the initial load is done:
``ready\\n`` or ``failed <message>\\n`` (then exits 1 when --exit-on-error), and writes a
heartbeat from its main loop twice a second (``supervision.StatusWriter``): the supervisor pings
systemd's watchdog only while it keeps coming.
"""

from __future__ import annotations

import gc
import logging
import signal
import sys
import time
from types import FrameType

from shoal.broker.loop import BrokerLoop
from shoal.broker.models import ModelManager
from shoal.process.lifecycle import (
    STOP_SIGNAL,
    die_with_parent,
    hold_instance_lock,
    ignore_group_signals,
    parent_died,
    setup_logging,
)
from shoal.process.supervision import StatusWriter
from shoal.settings import BrokerSettings

logger = logging.getLogger(__name__)

# After the supervisor's death: how long nothing must be in flight before the drain ends (a
# request a frontend submitted just before its own stop signal is on its way meanwhile).
DRAIN_SETTLE_S = 0.25


def run_broker(settings: BrokerSettings, status_fd: int, parent: int | None = None) -> int:
    """``parent``: the supervisor's pid (``die_with_parent``); None: never drain first."""
    stop_requested = False

    def on_term(signum: int, frame: FrameType | None) -> None:
        nonlocal stop_requested
        stop_requested = True

    ignore_group_signals()
    signal.signal(STOP_SIGNAL, on_term)
    status = StatusWriter(status_fd)
    models = ModelManager(settings)
    loop = BrokerLoop(settings, models)
    loop.start_all(time.monotonic())
    gc.collect()
    gc.freeze()
    reported = False
    exit_code = 0
    try:
        while not stop_requested:
            loop.poll_once()
            status.heartbeat(time.monotonic(), lambda: _model_counts(models))
            if not reported and loop.initial_load_done():
                reported = True
                failures = models.load_failures()
                if failures and settings.model_control.exit_on_error:
                    status.report("failed " + "; ".join(failures))
                    exit_code = 1
                    break
                status.report("ready" if not failures else
                              "ready-with-errors " + "; ".join(failures))
        if parent is not None and parent_died(parent):
            drain(loop, settings.exit_timeout_secs)
        shutdown(loop, settings.exit_timeout_secs)
    finally:
        loop.close()
    return exit_code


def _model_counts(models: ModelManager) -> tuple[int, int]:
    """(models serving, models that failed to load) for the heartbeat's systemd STATUS."""
    serving = sum(1 for record in models.records.values() if record.serving is not None)
    return serving, len(models.load_failures())


def requests_in_flight(loop: BrokerLoop) -> int:
    """Requests queued or executing (an open decoupled stream counts until its final
    answer), ensemble runs included."""
    runtimes = loop.models.runtimes()
    return (sum(len(runtime.requests) for runtime in runtimes)
            + sum(loop.ensembles.in_flight(runtime) for runtime in runtimes))


def drain(loop: BrokerLoop, timeout_s: float) -> None:
    """The supervisor died: serve on until no request has been in flight for DRAIN_SETTLE_S,
    or ``timeout_s`` passed (the frontends, draining too, send no new work)."""
    logger.warning("the supervisor died: serving the %d requests in flight (up to %.0f s), "
                   "then stopping", requests_in_flight(loop), timeout_s)
    deadline = time.monotonic() + timeout_s
    quiet_since: float | None = None
    while (now := time.monotonic()) < deadline:
        if requests_in_flight(loop):
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= DRAIN_SETTLE_S:
            return
        loop.poll_once()
    logger.warning("exit timeout expired with %d requests in flight", requests_in_flight(loop))


def shutdown(loop: BrokerLoop, timeout_s: float) -> None:
    loop.begin_shutdown()
    loop.flush_answers()
    deadline = time.monotonic() + max(timeout_s, 1.0)
    while loop.workers_alive() and time.monotonic() < deadline:
        loop.poll_once()
    loop.kill_remaining()
    loop.flush_answers()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    settings = BrokerSettings.from_json(args[0])
    status_fd = int(args[1]) if len(args) > 1 else -1
    setup_logging(settings, "broker")
    hold_instance_lock(settings)  # before any segment: a sweep must see this instance live
    parent = die_with_parent(STOP_SIGNAL)
    return run_broker(settings, status_fd, parent)
