"""The broker's status pipe: heartbeats at most twice a second, never blocking the broker when
the supervisor stops reading; reports and heartbeats read back as lines."""

from __future__ import annotations

import fcntl
import os
import time

from shoal.process.supervision import HEARTBEAT_PERIOD_S, StatusPipe, StatusWriter, parse_heartbeat


def test_heartbeats_are_spaced_and_carry_the_counts() -> None:
    pipe = StatusPipe()
    writer = StatusWriter(pipe.write_fd)
    calls: list[int] = []

    def counts() -> tuple[int, int]:
        calls.append(1)
        return 3, 1

    writer.heartbeat(10.0, counts)
    writer.heartbeat(10.0 + HEARTBEAT_PERIOD_S / 2, counts)  # too soon: nothing, no count
    writer.heartbeat(10.0 + HEARTBEAT_PERIOD_S, counts)
    assert pipe.read_lines() == ["alive 3 1", "alive 3 1"]
    assert len(calls) == 2
    pipe.close()


def test_a_report_is_followed_by_a_heartbeat_at_once() -> None:
    pipe = StatusPipe()
    writer = StatusWriter(pipe.write_fd)
    writer.heartbeat(10.0, lambda: (0, 0))
    writer.report("ready-with-errors a: bad\nconfig")
    writer.heartbeat(10.1, lambda: (2, 1))  # fresh counts right after the report
    assert pipe.read_lines() == ["alive 0 0", "ready-with-errors a: bad config", "alive 2 1"]
    pipe.close()


def test_a_full_pipe_drops_heartbeats_without_blocking() -> None:
    pipe = StatusPipe()
    writer = StatusWriter(pipe.write_fd)
    assert fcntl.fcntl(pipe.write_fd, fcntl.F_GETFL) & os.O_NONBLOCK
    fill = b"x" * 4096
    try:
        while True:
            os.write(pipe.write_fd, fill)
    except BlockingIOError:
        pass
    started = time.monotonic()
    for i in range(10):
        writer.heartbeat(float(i), lambda: (1, 0))
    assert time.monotonic() - started < 1.0
    pipe.close()


def test_no_pipe_no_writes() -> None:
    writer = StatusWriter(-1)
    writer.heartbeat(0.0, lambda: (1, 0))
    writer.report("ready")


def test_parse_heartbeat() -> None:
    assert parse_heartbeat("alive 4 0") == (4, 0)
    for line in ("ready", "alive", "alive 4", "alive x 0", "alive 1 2 3", "failed alive 1 2"):
        assert parse_heartbeat(line) is None
