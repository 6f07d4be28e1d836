"""A worker's stdout and stderr through a byte-rate limit, so a model cannot grow the log
without bound (README "Faults and limits").

``limit_output`` (called first thing in a worker, before logging is set up) puts a pipe under
file descriptors 1 and 2: everything the process writes there, the worker's own log lines, a
python model's ``print``, a native library's output, goes through one token bucket per worker
(``RATE_BYTES_PER_S`` sustained, ``BURST_BYTES`` at once) on its way to the descriptors the
worker was started with. Output past the bucket is dropped whole lines at a time (a line cut by
the limit is dropped to its end), and at most every ``NOTE_INTERVAL_S`` one line says how much
was dropped, naming the model and the instance; the count left at exit is said too.

Threads: one daemon thread (``shoal-output``) reads both pipes and writes; the process's other
threads only write to descriptors 1 and 2. At exit (``atexit``) descriptors 1 and 2 are put
back and the thread is given ``DRAIN_S`` to write what is still in the pipes. A fatal signal's
traceback (``faulthandler``) is written straight to the original stderr, past the pipe, since
the reading thread dies with the process. A process killed with SIGKILL loses what was still
in the pipes (at most a pipe buffer, 64 KiB, each).
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import re
import selectors
import sys
import threading
import time
from typing import BinaryIO, Final

RATE_BYTES_PER_S: Final = 64 * 1024
BURST_BYTES: Final = 1024 * 1024
NOTE_INTERVAL_S: Final = 5.0
DRAIN_S: Final = 2.0
_READ_BYTES: Final = 65536
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")


class OutputBudget:
    """The token bucket and the drop count (pure: the clock is passed in). ``admit`` returns
    the part of ``data`` to write; ``note`` the line that reports drops, when one is due."""

    def __init__(self, label: str, rate: float = RATE_BYTES_PER_S,
                 burst: float = BURST_BYTES, now: float = 0.0) -> None:
        self.label = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", label)
        self._rate = rate
        self._burst = burst
        self._tokens = burst
        self._at = now
        self._skipping_line = False  # dropping the rest of a line the limit cut
        self.dropped = 0  # bytes dropped since the last note
        self._noted_at = now

    def admit(self, data: bytes, now: float) -> bytes:
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._skipping_line:
            end = data.find(b"\n")
            if end < 0:
                self.dropped += len(data)
                return b""
            self.dropped += end + 1
            data = data[end + 1:]
            self._skipping_line = False
        if len(data) <= self._tokens:
            self._tokens -= len(data)
            return data
        cut = data.rfind(b"\n", 0, int(self._tokens)) + 1  # whole lines only
        self._tokens -= cut
        self.dropped += len(data) - cut
        self._skipping_line = not data.endswith(b"\n")
        return data[:cut]

    def note(self, now: float, final: bool = False) -> bytes:
        """The drop report due now (every ``NOTE_INTERVAL_S`` at most; ``final``: any count
        left), or b""."""
        if not self.dropped or (not final and now - self._noted_at < NOTE_INTERVAL_S):
            return b""
        line = (f"shoal: {self.dropped} bytes of output from {self.label} dropped (over "
                f"{RATE_BYTES_PER_S} bytes/s, bursts of {BURST_BYTES})\n")
        self.dropped = 0
        self._noted_at = now
        return line.encode()


def limit_output(model_name: str, instance_name: str) -> None:
    """Route descriptors 1 and 2 of this process through an ``OutputBudget`` (see the module
    docstring). Call once, before anything caches a duplicate of descriptor 1 or 2."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    originals = {fd: os.dup(fd) for fd in (1, 2)}
    readers: dict[int, int] = {}  # pipe read end -> original descriptor
    for fd, original in originals.items():
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        readers[read_end] = original
    direct = os.fdopen(originals[2], "wb", buffering=0, closefd=False)
    faulthandler.enable(file=direct)
    budget = OutputBudget(f"model {model_name} instance {instance_name}",
                          now=time.monotonic())
    pump = threading.Thread(target=_pump, args=(readers, originals[2], budget),
                            name="shoal-output", daemon=True)
    pump.start()
    atexit.register(_restore, originals, pump, direct)


def _pump(readers: dict[int, int], note_fd: int, budget: OutputBudget) -> None:
    selector = selectors.DefaultSelector()
    for read_end in readers:
        selector.register(read_end, selectors.EVENT_READ)
    ends_line = dict.fromkeys(readers.values(), True)
    while readers:
        for key, _ in selector.select(NOTE_INTERVAL_S):
            read_end = int(key.fd)
            data = os.read(read_end, _READ_BYTES)
            if not data:
                selector.unregister(read_end)
                os.close(read_end)
                del readers[read_end]
                continue
            out = readers[read_end]
            passed = budget.admit(data, time.monotonic())
            if passed:
                _write(out, passed)
                ends_line[out] = passed.endswith(b"\n")
        note = budget.note(time.monotonic(), final=not readers)
        if note:
            _write(note_fd, note if ends_line[note_fd] else b"\n" + note)
            ends_line[note_fd] = True
    selector.close()


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue
        except OSError:
            return  # the log is gone: nothing to tell


def _restore(originals: dict[int, int], pump: threading.Thread, direct: BinaryIO) -> None:
    """At exit: descriptors 1 and 2 back to the originals (the pipes' last write ends close,
    unless a child process holds them), then let the thread write what is left."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    faulthandler.disable()
    for fd, original in originals.items():
        os.dup2(original, fd)
    pump.join(DRAIN_S)
    direct.close()  # (closefd=False: the original descriptor stays open)
