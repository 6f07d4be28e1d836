"""The supervisor: ``shoal serve``. Starts the broker and the frontends, forwards signals, tells
systemd READY/STATUS/WATCHDOG/STOPPING (``sd_notify.py``; WATCHDOG only while the broker's
loop heartbeats), restarts a frontend that dies (``restarts.py``), and exits
non-zero when a child it cannot replace dies: the broker (systemd, or whoever runs ``shoal serve``,
restarts the whole server), or a frontend that keeps dying at once.

Start-up: sweep segments of dead servers, preflight /dev/shm, check that the ports are free (the
error names the process that holds one), create this server's instance lock (every child joins
it, see shm/sweep.py). Shutdown (SIGTERM/SIGINT): the frontends drain first (in-flight requests
finish), then the broker finalizes the models; finally the supervisor leaves the lock, and the
last process of the instance out removes its segments, runtime dir and lock file.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from types import FrameType

import msgspec

from shoal.process.lifecycle import STOP_SIGNAL, leave_instance, setup_logging
from shoal.process.ports import taken_ports
from shoal.process.supervision import StatusPipe, parse_heartbeat, sweep_runtime_dirs
from shoal.process.torch_build import warn_if_cuda_torch_without_gpu
from shoal.server.restarts import MAX_QUICK_DEATHS, QUICK_DEATH_S, RestartTracker
from shoal.server.sd_notify import ServiceNotifications, SystemdNotifier
from shoal.settings import InstanceSettings, Settings
from shoal.shm.preflight import ShmTooSmall, check_shm_capacity
from shoal.shm.sweep import (
    InstanceLock,
    new_instance_id,
    remove_segments_with_prefix,
    sweep_stale_segments,
)

logger = logging.getLogger("shoal.supervisor")

_TICK_S = 0.1
_LEAVE_WAIT_S = 2.0


class FrontendSlot:
    """Frontend process ``index`` (0 also serves /metrics) and its restart history."""

    def __init__(self, index: int, process: subprocess.Popen[bytes], now: float) -> None:
        self.index = index
        self.process = process
        self.restarts = RestartTracker(started_at=now)
        self.restart_at: float | None = None  # set while waiting out a back-off


class Supervisor:
    def __init__(self, settings: Settings, notifier: SystemdNotifier | None = None) -> None:
        self.settings = settings
        self.systemd = ServiceNotifications(notifier or SystemdNotifier(None))
        self.stop_signal: int | None = None
        self.broker: subprocess.Popen[bytes] | None = None
        self.frontends: list[FrontendSlot] = []
        self.status = StatusPipe()

    def start_children(self) -> None:
        self.broker = subprocess.Popen(
            [sys.executable, "-m", "shoal.broker", self.settings.for_broker().to_json().decode(),
             str(self.status.write_fd)],
            pass_fds=(self.status.write_fd,), stdin=subprocess.DEVNULL)
        self.status.close_writer()
        # frontend 0 also serves /metrics; all share the HTTP port (SO_REUSEPORT)
        now = time.monotonic()
        self.frontends = [FrontendSlot(index, self.spawn_frontend(index), now)
                          for index in range(self.settings.http.workers)]

    def spawn_frontend(self, index: int) -> subprocess.Popen[bytes]:
        """Frontend ``index``; it watches the broker's pid (argv) and ends every request in
        flight at once when the broker dies."""
        assert self.broker is not None
        return subprocess.Popen(
            [sys.executable, "-m", "shoal.frontend",
             self.settings.for_frontends().to_json().decode(),
             str(index), str(self.broker.pid)], stdin=subprocess.DEVNULL)

    def run(self) -> int:
        self.start_children()
        assert self.broker is not None
        self.systemd.starting()
        while self.stop_signal is None:
            time.sleep(_TICK_S)
            if not self.read_status(time.monotonic()):
                self.stop(graceful=False)
                return 1
            if self.broker.poll() is not None:
                logger.error("the broker process exited unexpectedly (%s); shutting down (exit "
                             "1: the service manager restarts the server)",
                             _exit_reason(self.broker.returncode))
                self.stop(graceful=False)
                return 1
            if not self.watch_frontends(time.monotonic()):
                self.stop(graceful=False)
                return 1
            self.systemd.tick(time.monotonic())
        logger.info("received %s; shutting down", signal.Signals(self.stop_signal).name)
        self.systemd.stopping()
        return self.stop(graceful=True)

    def read_status(self, now: float) -> bool:
        """Every line the broker wrote since the last pass; False: the initial load failed
        (with --exit-on-error) and the server must stop."""
        for line in self.status.read_lines():
            if (counts := parse_heartbeat(line)) is not None:
                self.systemd.on_heartbeat(now, *counts)
            elif line.startswith("ready"):
                if line != "ready":
                    logger.error("some models failed to load: %s", line.partition(" ")[2])
                logger.info("shoal is serving on port %d", self.settings.http.port)
                self.systemd.on_ready()
            elif line.startswith("failed"):
                logger.error("failed to load all models: %s", line.partition(" ")[2])
                return False
        return True

    def watch_frontends(self, now: float) -> bool:
        """Restart frontends that died (after their back-off); False: one keeps dying, give
        up. The broker keeps serving meanwhile; the dead one's in-flight requests end (their
        clients lose the connection; the broker drops the answers and frees their memory)."""
        for slot in self.frontends:
            if slot.restart_at is not None:
                if now >= slot.restart_at:
                    slot.process, slot.restart_at = self.spawn_frontend(slot.index), None
                    slot.restarts.started(now)
                    logger.info("restarted frontend %d (pid %d)", slot.index, slot.process.pid)
                continue
            if slot.process.poll() is None:
                continue
            reason = _exit_reason(slot.process.returncode)
            self.remove_arena(slot.process.pid)
            delay = slot.restarts.died(now)
            if delay is None:
                logger.error("frontend %d (pid %d) %s; it died %d times in a row, each within "
                             "%.0f s of its start: giving up, shutting down", slot.index,
                             slot.process.pid, reason, MAX_QUICK_DEATHS, QUICK_DEATH_S)
                return False
            logger.error("frontend %d (pid %d) %s; restarting it in %.1f s", slot.index,
                         slot.process.pid, reason, delay)
            slot.restart_at = now + delay
        return True

    def remove_arena(self, pid: int) -> None:
        """A dead frontend's input arena (workers that still read an input keep their mapping;
        one not mapped yet fails only that request, whose answer has nowhere to go)."""
        from shoal.frontend.core.dataplane_impl import frontend_identity

        remove_segments_with_prefix(
            f"{self.settings.instance.segment_prefix}{frontend_identity(pid)}-")

    def stop(self, graceful: bool) -> int:
        """Frontend first (drains in-flight requests), then the broker (finalizes models)."""
        budget = self.settings.exit_timeout_secs + 5.0
        code = 0
        frontends = [slot.process for slot in self.frontends]
        for stage in (frontends, [self.broker] if self.broker else []):
            running = [c for c in stage if c.poll() is None]
            for child in running:
                child.send_signal(STOP_SIGNAL)
            deadline = time.monotonic() + (budget if graceful else 10.0)
            for child in running:
                try:
                    child.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    logger.error("pid %d did not stop in time; killing it", child.pid)
                    child.kill()
                    child.wait()
                    code = 1
        return code


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def run_supervisor(settings: Settings) -> int:
    setup_logging(settings, "shoal")
    warn_if_cuda_torch_without_gpu()  # a CUDA torch on a machine without a GPU: the fix
    notifier = SystemdNotifier.from_environment()  # and out of the children's environment
    removed = sweep_stale_segments()
    if removed:
        logger.info("removed %d shared-memory segments left by dead servers", len(removed))
    sweep_runtime_dirs(tempfile.gettempdir())
    try:
        check_shm_capacity(2 * settings.shm.segment_bytes)
    except ShmTooSmall as exc:
        logger.error("%s", exc)
        return 2
    taken = taken_ports(settings)
    for message in taken:
        logger.error("%s", message)
    if taken:
        return 1
    instance_id = new_instance_id()
    lock = InstanceLock(instance_id)
    runtime_dir = os.path.join(tempfile.gettempdir(), f"shoal-{instance_id}")
    os.makedirs(runtime_dir, mode=0o700)
    settings = msgspec.structs.replace(settings, instance=InstanceSettings(
        instance_id=instance_id, runtime_dir=runtime_dir))
    supervisor = Supervisor(settings, notifier)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        supervisor.stop_signal = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return supervisor.run()
    finally:
        supervisor.status.close()
        notifier.close()
        # the last one out removes the instance's files; children stopped (or were killed)
        # above, so only a worker of a killed broker may still be on its way out
        if not leave_instance(lock, settings, wait_s=_LEAVE_WAIT_S):
            logger.warning("processes of this server still run; the last of them to exit "
                           "removes its shared memory")
