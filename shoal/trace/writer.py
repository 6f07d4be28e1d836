"""The tracer's writer thread: finished traces are formatted and written (or exported) here, off
the request path. The event loop only enqueues (``queue.SimpleQueue.put``, no lock held while
formatting); the thread does the commands in order.

Commands: ``add(batch, trace)`` (a finished trace joins batch ``batch``), ``flush(batch,
indexed)`` (the batch is complete: write it to ``<file>.<k>`` or append it to ``<file>``, the
loop decides which, as Triton's ``WriteTrace``), ``close`` (finish the file / export the spans
still queued, then end the thread). Sinks: ``FileSink`` (Triton's JSON) and ``OtelSink``.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Protocol

from shoal.trace.files import TraceFile
from shoal.trace.otel import OtelExporter
from shoal.trace.record import RequestTrace
from shoal.trace.triton_format import trace_json

logger = logging.getLogger(__name__)

_Command = tuple[str, int, object]


class TraceSink(Protocol):
    def add(self, batch: int, trace: RequestTrace) -> None: ...

    def flush(self, batch: int, indexed: bool) -> None: ...

    def close(self) -> None: ...


class FileSink:
    """Triton's JSON trace file; each batch is kept formatted until it is flushed."""

    def __init__(self, path: str) -> None:
        self.file = TraceFile(path)
        self._batches: dict[int, list[bytes]] = {}

    def add(self, batch: int, trace: RequestTrace) -> None:
        self._batches.setdefault(batch, []).append(trace_json(trace))

    def flush(self, batch: int, indexed: bool) -> None:
        traces = self._batches.pop(batch, [])
        if traces:
            if indexed:
                self.file.write_indexed(traces)
            else:
                self.file.append(traces)

    def close(self) -> None:
        for batch in list(self._batches):  # batches nobody flushed (not expected): keep them
            self.flush(batch, False)
        self.file.close()


class OtelSink:
    """OpenTelemetry spans; the SDK batches them itself (batches mean nothing here)."""

    def __init__(self, exporter: OtelExporter) -> None:
        self._exporter = exporter

    def add(self, batch: int, trace: RequestTrace) -> None:
        self._exporter.export(trace)

    def flush(self, batch: int, indexed: bool) -> None:
        pass

    def close(self) -> None:
        self._exporter.close()


class TraceWriter:
    """Owns ``sink`` from the first command on (the thread starts then)."""

    def __init__(self, sink: TraceSink) -> None:
        self._sink = sink
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, batch: int, trace: RequestTrace) -> None:
        self._put(("add", batch, trace))

    def flush(self, batch: int, indexed: bool) -> None:
        self._put(("flush", batch, indexed))

    def _put(self, command: _Command) -> None:
        if self._closed:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trace-writer", daemon=True)
            self._thread.start()
        self._commands.put(command)

    def close(self, timeout_s: float = 15.0) -> None:
        """Finish what was queued (bounded by ``timeout_s``), then stop."""
        if self._closed:
            return
        self._put(("close", 0, None))
        self._closed = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.warning("trace writer still busy after %.0f s; traces may be lost",
                               timeout_s)

    def _run(self) -> None:
        while True:
            kind, batch, value = self._commands.get()
            try:
                if kind == "add":
                    assert isinstance(value, RequestTrace)
                    self._sink.add(batch, value)
                elif kind == "flush":
                    self._sink.flush(batch, bool(value))
                else:
                    self._sink.close()
                    return
            except Exception:
                logger.exception("trace writer: %s failed", kind)
