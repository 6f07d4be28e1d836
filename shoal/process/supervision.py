"""Small process-supervision helpers with no knowledge of models: the broker's status pipe (both
ends) and removal of dead servers' runtime directories. systemd notification: ``sd_notify.py``.

Status lines, broker -> supervisor, each newline-terminated:
  ``ready`` / ``ready-with-errors <messages>`` / ``failed <messages>``: the initial load is done;
  ``alive <serving> <failed>``: the heartbeat of the broker's main loop (at least every second
  while the loop runs; the counts are models serving and models that failed to load).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import select
import shutil
import time
from collections.abc import Callable

from shoal.shm.sweep import instance_alive

logger = logging.getLogger(__name__)

HEARTBEAT_PERIOD_S = 0.5
_REPORT_WAIT_S = 5.0


class StatusPipe:
    """One-way pipe broker -> supervisor carrying newline-terminated status lines."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_inheritable(self.write_fd, True)
        flags = fcntl.fcntl(self.read_fd, fcntl.F_GETFL)
        fcntl.fcntl(self.read_fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        self._buffer = b""
        self._writer_open = True

    def close_writer(self) -> None:
        if self._writer_open:
            os.close(self.write_fd)
            self._writer_open = False

    def read_line(self) -> str | None:
        try:
            chunk = os.read(self.read_fd, 65536)
            self._buffer += chunk
        except BlockingIOError:
            pass
        line, sep, rest = self._buffer.partition(b"\n")
        if not sep:
            return None
        self._buffer = rest
        return line.decode(errors="replace")

    def read_lines(self) -> list[str]:
        """Every complete line waiting (heartbeats arrive twice a second: read them all)."""
        lines = []
        while (line := self.read_line()) is not None:
            lines.append(line)
        return lines

    def close(self) -> None:
        self.close_writer()
        os.close(self.read_fd)


class StatusWriter:
    """The broker's end of the status pipe (``fd`` < 0: no pipe, every call a no-op). The fd is
    made non-blocking: a heartbeat that finds the pipe full is dropped (a supervisor that does
    not read needs none, and the broker loop must never block on it); a report waits up to
    5 s for room."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.last_heartbeat = float("-inf")
        if fd >= 0:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)

    def report(self, line: str) -> None:
        """One whole line (newlines inside become spaces); the next heartbeat goes out at once,
        so the counts after a report are fresh."""
        data = (line.replace("\n", " ") + "\n").encode()
        deadline = time.monotonic() + _REPORT_WAIT_S
        while data and self.fd >= 0:
            try:
                data = data[os.write(self.fd, data):]
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    logger.warning("the supervisor does not read the status pipe; dropped %r",
                                   line[:80])
                    break
                select.select([], [self.fd], [], 0.1)
            except OSError:  # the supervisor is gone; die_with_parent stops us
                break
        self.last_heartbeat = float("-inf")

    def heartbeat(self, now: float, counts: Callable[[], tuple[int, int]]) -> None:
        """``alive <serving> <failed>`` when HEARTBEAT_PERIOD_S has passed since the last one;
        ``counts`` is called only then."""
        if self.fd < 0 or now - self.last_heartbeat < HEARTBEAT_PERIOD_S:
            return
        self.last_heartbeat = now
        serving, failed = counts()
        with contextlib.suppress(OSError):  # full (BlockingIOError) or closed: dropped
            os.write(self.fd, f"alive {serving} {failed}\n".encode())


def parse_heartbeat(line: str) -> tuple[int, int] | None:
    """``alive <serving> <failed>`` -> the counts; None for any other line."""
    kind, _, rest = line.partition(" ")
    fields = rest.split()
    if kind != "alive" or len(fields) != 2 or not all(f.isdigit() for f in fields):
        return None
    return int(fields[0]), int(fields[1])


def sweep_runtime_dirs(tmp_dir: str, shm_dir: str = "/dev/shm") -> list[str]:
    """Remove ``<tmp>/shoal-<id>`` socket directories whose server holds no instance lock."""
    removed: list[str] = []
    for entry in os.listdir(tmp_dir):
        instance_id = entry[len("shoal-"):]
        if not (entry.startswith("shoal-") and len(instance_id) == 12 and
                all(c in "0123456789abcdef" for c in instance_id)):
            continue
        path = os.path.join(tmp_dir, entry)
        if not os.path.isdir(path) or instance_alive(instance_id, shm_dir):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(entry)
    return removed
