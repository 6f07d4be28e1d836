"""Triton's trace files (tracer.cc ``TraceFile``): where a batch of formatted traces goes.

``log_frequency`` 0: every batch is appended to ``<file>``, one JSON array opened (truncating
the file) at the first batch and closed with ``]`` when the tracer closes (the server's exit), so
the file is complete JSON once the server has stopped. ``log_frequency`` N > 0 (or a
``trace_count`` used up): each batch is its own complete array in ``<file>.<k>``, k = 0, 1, ...
in the order the batches are written.

Write failures are logged, never raised: tracing must not take the server down.
Threads: the writer thread only.
"""

from __future__ import annotations

import logging
from typing import BinaryIO

logger = logging.getLogger(__name__)


class TraceFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self.next_index = 0
        self._main: BinaryIO | None = None

    def write_indexed(self, traces: list[bytes]) -> str:
        """One batch as ``<file>.<k>``; returns that name."""
        name = f"{self.path}.{self.next_index}"
        self.next_index += 1
        try:
            with open(name, "wb") as out:
                out.write(b"[" + b",".join(traces) + b"]")
        except OSError as exc:
            logger.error("cannot write trace file %s: %s", name, exc)
        return name

    def append(self, traces: list[bytes]) -> None:
        """One batch into ``<file>``'s array."""
        try:
            if self._main is None:
                self._main = open(self.path, "wb")  # noqa: SIM115 (closed in close())
                self._main.write(b"[")
            else:
                self._main.write(b",")
            self._main.write(b",".join(traces))
            self._main.flush()
        except OSError as exc:
            logger.error("cannot write trace file %s: %s", self.path, exc)

    def close(self) -> None:
        if self._main is not None:
            try:
                self._main.write(b"]")
                self._main.close()
            except OSError as exc:
                logger.error("cannot finish trace file %s: %s", self.path, exc)
            self._main = None
