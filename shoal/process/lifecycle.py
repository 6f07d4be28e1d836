"""Process hygiene shared by every shoal child process: die with the parent, hold the instance
lock, log setup."""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import shutil
import signal
import sys
import time

from shoal.process.log_escape import EscapeControlCharacters
from shoal.settings import BrokerSettings, FrontendSettings, Settings, WorkerSettings
from shoal.shm.sweep import (
    LEAVE_WAIT_S,
    InstanceGone,
    InstanceLock,
    remove_segments_with_prefix,
)

logger = logging.getLogger(__name__)

# each process has only its part (BrokerSettings, FrontendSettings, WorkerSettings)
ProcessSettings = Settings | BrokerSettings | FrontendSettings | WorkerSettings

_PR_SET_PDEATHSIG = 1


# Children of the supervisor ignore SIGTERM/SIGINT (a signal to the whole process group, e.g.
# Ctrl-C, must not bypass the orderly shutdown) and stop on STOP_SIGNAL, which their parent sends
# and which the kernel sends when their parent dies.
STOP_SIGNAL = signal.SIGUSR1


def ignore_group_signals() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def die_with_parent(sig: int = STOP_SIGNAL) -> int:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux prctl).
    Also covers the race where the parent died before the call (then send it ourselves).
    Returns the parent's pid as of the call: ``parent_died`` compares against it. What a
    process does on ``sig`` is its own contract: every shoal child drains its work first (a
    dead parent is a stop like SIGTERM's, not a crash)."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return parent
    if os.getppid() != parent or (parent == 1 and not _init_is_shoal()):
        os.kill(os.getpid(), sig)
    return parent


def _init_is_shoal() -> bool:
    """Whether pid 1 (of this pid namespace) is a shoal process. A parent pid of 1 means either
    that the parent died before ``prctl`` and this process was re-parented to init, or that
    shoal itself is pid 1: a container's entrypoint without an init (``docker run`` without
    ``--init``, a Kubernetes container), whose children must not take it for dead."""
    try:
        with open("/proc/1/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return True  # cannot tell: do not stop a healthy process
    return any(b"shoal" in os.path.basename(arg) for arg in argv[:3])


def parent_died(parent: int) -> bool:
    """True when the process that was this one's parent (pid ``parent``, from
    ``die_with_parent``) is gone: this process was re-parented (to init or a subreaper)."""
    return os.getppid() != parent


def log_level(verbose: int, info: bool = True, warning: bool = True, error: bool = True) -> int:
    """The Python logging level of Triton's log switches: verbose > 0 -> DEBUG, else the most
    verbose of INFO / WARNING / ERROR that is on, else nothing below CRITICAL."""
    if verbose > 0:
        return logging.DEBUG
    for on, level in ((info, logging.INFO), (warning, logging.WARNING), (error, logging.ERROR)):
        if on:
            return level
    return logging.CRITICAL


def setup_logging(settings: ProcessSettings, role: str) -> None:
    """The process's logging, to standard error, at the level of ``--log-verbose`` and
    ``--log-info``/``-warning``/``-error``; ``--log-format ISO8601`` stamps lines in UTC ISO
    8601."""
    handler = logging.StreamHandler(sys.stderr)
    line = f"%(asctime)s %(levelname)s [{role} pid %(process)d] %(name)s: %(message)s"
    if settings.log.format == "ISO8601":
        formatter = logging.Formatter(line, datefmt="%Y-%m-%dT%H:%M:%SZ")
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter(line)
    handler.setFormatter(formatter)
    handler.addFilter(EscapeControlCharacters())  # client strings cannot forge lines
    logging.basicConfig(level=log_level(settings.log.verbose, settings.log.info,
                                        settings.log.warning, settings.log.error),
                        handlers=[handler])


def hold_instance_lock(settings: ProcessSettings) -> None:
    """Join the server instance's lock for the rest of this process's life (shm/sweep.py): while
    any process of the instance lives, no other server sweeps its segments. At a normal exit the
    share is given up; the last process of the instance out removes what the instance left
    (``remove_instance_files``). Settings without an instance id (in-process tests): no-op.
    A process whose instance is already gone exits (SystemExit, code 1)."""
    if not settings.instance.instance_id:
        return
    try:
        lock = InstanceLock.join(settings.instance.instance_id)
    except InstanceGone as exc:
        raise SystemExit(f"{exc}; not starting") from None
    atexit.register(leave_instance, lock, settings)


def leave_instance(lock: InstanceLock, settings: ProcessSettings,
                   wait_s: float = LEAVE_WAIT_S) -> bool:
    """Give up this process's share of the instance lock; True when this was the last process
    of the instance (it then removed the instance's segments, runtime dir and lock file).
    ``wait_s``: how long other members that are exiting are waited for."""
    def on_last() -> None:
        remove_instance_files(settings)

    return lock.leave(on_last=on_last, wait_s=wait_s)


def remove_instance_files(settings: ProcessSettings) -> list[str]:
    """Every segment of the instance, and its runtime dir. Only for the instance's last
    process (it holds the lock exclusively). Returns the segments removed."""
    removed = remove_segments_with_prefix(settings.instance.segment_prefix)
    if removed:
        logger.warning("removed %d shared-memory segments the processes of instance %s left "
                       "behind", len(removed), settings.instance.instance_id)
    if settings.instance.runtime_dir:
        shutil.rmtree(settings.instance.runtime_dir, ignore_errors=True)
    return removed
