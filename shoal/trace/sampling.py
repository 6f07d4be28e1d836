"""The frontend's tracer: which requests are traced, the trace settings (global and per model),
and when finished traces are written. Triton's ``TraceManager`` (tracer.cc), per frontend process.

Sampling: each scope (the global settings, or a model's own) counts the requests it sees and
traces every ``trace_rate``-th, while ``trace_count`` (-1 = no limit) is not used up; an untraced
request costs a dict lookup and one counter increment, and nothing at all while no scope can
trace. A scope is replaced (its counters start again) by every update that touches it, as
Triton replaces its ``TraceSetting`` objects.

Settings: a model's scope has the fields the API set for it and mirrors the global scope in the
others (also after later global updates); clearing a field (``null``) takes it back to the
global value (for a global field: the start-up value); a model with no field of its own uses the
global scope. ``trace_count`` reads as the traces still to take.

Writing, as Triton's ``WriteTrace``: a finished trace joins its scope's batch; the batch goes to
``<file>.<k>`` when it holds ``log_frequency`` traces, or when the scope's ``trace_count`` is used
up and its last trace finished; what is left goes to ``<file>`` (``log_frequency`` 0) or to one
more ``<file>.<k>`` when the scope is replaced or the tracer closes. OpenTelemetry mode exports
each trace as it finishes.

Threads: the frontend's event loop (one per process: ``--http-workers`` N gives N tracers, each
with its own settings, counters and file, see ``config.frontend_trace_file``). The writer thread
only formats and writes.
"""

from __future__ import annotations

import itertools
from typing import Any

from shoal.errors import invalid_arg
from shoal.trace.config import TraceConfig, TraceLevel, TraceMode, frontend_trace_file
from shoal.trace.record import RequestTrace
from shoal.trace.values import (
    COUNT,
    FIELDS,
    SettingsChange,
    TraceValues,
    check_valid,
    settings_document,
)
from shoal.trace.writer import FileSink, OtelSink, TraceSink, TraceWriter


class SamplingScope:
    """One set of settings in force (Triton's ``TraceSetting``) and its counters."""

    __slots__ = ("active", "batch", "created", "in_flight", "pending", "remaining", "retired",
                 "seen", "specified", "tensors", "values")

    def __init__(self, values: TraceValues, specified: frozenset[str], batch: int,
                 can_write: bool, mode: TraceMode) -> None:
        self.values = values
        self.specified = specified
        self.batch = batch  # the writer's batch key of this scope
        self.remaining = values.count
        self.active = (bool(values.level) and values.rate > 0 and values.count != 0
                       and can_write)
        self.tensors = bool(values.level & TraceLevel.TENSORS) and mode is TraceMode.TRITON
        self.seen = 0
        self.created = 0
        self.in_flight = 0
        self.pending = 0  # finished traces in the current batch
        self.retired = False

    def current(self) -> TraceValues:
        """The values as the API reports them (the count is what is left)."""
        v = self.values
        return TraceValues(v.level, v.rate, self.remaining, v.log_frequency)


class Tracer:
    """``index`` / ``workers``: this frontend's index among ``--http-workers`` (trace ids are
    unique across them; the file of frontend i > 0 is ``<file>.fe<i>``)."""

    def __init__(self, config: TraceConfig, index: int = 0, workers: int = 1) -> None:
        self.config = config
        self.trace_file = frontend_trace_file(config, index)
        self._can_write = config.mode is TraceMode.OPENTELEMETRY or bool(self.trace_file)
        self._defaults = TraceValues(config.level, config.rate, config.count,
                                     config.log_frequency)
        self._ids = itertools.count(index + 1, max(1, workers))
        self._batches = itertools.count(1)
        self._global = self._scope(self._defaults, frozenset())
        self._models: dict[str, SamplingScope] = {}
        self._enabled = False
        self._writer: TraceWriter | None = None
        if config.mode is TraceMode.OPENTELEMETRY and config.level:
            self._writer = self._new_writer()  # the SDK's start-up, not on a request's path
        self._refresh()

    # ---------------------------------------------------------------- request path

    def sample(self, model: str) -> RequestTrace | None:
        """A trace for this request of ``model``, or None (almost always)."""
        if not self._enabled:
            return None
        scope = self._models.get(model, self._global) if self._models else self._global
        if not scope.active:
            return None
        scope.seen += 1
        if scope.seen % scope.values.rate:
            return None
        if scope.remaining > 0:
            scope.remaining -= 1
            if scope.remaining == 0:
                scope.active = False
                self._refresh()
        scope.created += 1
        scope.in_flight += 1
        trace = RequestTrace(next(self._ids), model, scope, scope.tensors)
        trace.timestamps = bool(scope.values.level & TraceLevel.TIMESTAMPS)
        return trace

    def finish(self, trace: RequestTrace) -> None:
        """The request is over (answered, failed or abandoned): write its trace. Once per
        trace; later calls do nothing."""
        if trace.done:
            return
        trace.done = True
        scope = trace.scope
        assert isinstance(scope, SamplingScope)
        scope.in_flight -= 1
        scope.pending += 1
        writer = self._writer or self._new_writer()
        writer.add(scope.batch, trace)
        every = scope.values.log_frequency
        if (scope.remaining == 0 and scope.in_flight == 0) or (every and scope.pending >= every):
            self._flush(scope, indexed=True)
        elif scope.retired and scope.in_flight == 0:
            self._flush(scope, indexed=every != 0)

    # ---------------------------------------------------------------- settings API

    def settings(self, model: str = "") -> dict[str, str | list[str]]:
        """The settings in force for ``model`` ("" = global), as the API answers them."""
        scope = self._models.get(model, self._global) if model else self._global
        return settings_document(scope.current(), self.config, self.trace_file)

    def update(self, model: str, change: SettingsChange) -> dict[str, str | list[str]]:
        """Apply ``change`` to ``model``'s settings ("" = global) as a whole (INVALID_ARG and
        nothing changed if a resulting setting could never trace); returns ``settings``."""
        if model:
            derived = self._derive(self._models.get(model), self._global.current(), change,
                                   for_model=True)
            self._replace_model(model, derived)
        else:
            derived_global = self._derive(self._global, self._defaults, change, for_model=False)
            assert derived_global is not None
            new_global = self._scope(*derived_global)
            mirrors = {name: self._derive(scope, new_global.current(), SettingsChange(),
                                          for_model=True)
                       for name, scope in self._models.items()
                       if scope.specified != frozenset(FIELDS)}
            self._retire(self._global)
            self._global = new_global
            for name, derived in mirrors.items():
                self._replace_model(name, derived)
        self._refresh()
        return self.settings(model)

    def _derive(self, current: SamplingScope | None, fallback: TraceValues,
                change: SettingsChange, *, for_model: bool
                ) -> tuple[TraceValues, frozenset[str]] | None:
        """Triton's UpdateTraceSettingInternal: a field is set by the change, else kept if the
        scope set it before (and the change does not clear it), else the fallback's."""
        values: dict[str, Any] = {}
        specified: set[str] = set()
        for name in FIELDS:
            mine = name not in change.clears and (
                name in change.sets or (current is not None and name in current.specified))
            if mine:
                specified.add(name)
                values[name] = change.sets[name] if name in change.sets else (
                    current.current().get(name) if current is not None else fallback.get(name))
            else:
                values[name] = fallback.get(name)
        if for_model and not specified:
            return None
        result = TraceValues.of(values)
        if result.count < -1:
            raise invalid_arg(f"Unable to parse '{COUNT}'. Expecting value >= -1")
        check_valid(result, self.config)
        return result, frozenset(specified)

    def _replace_model(self, model: str,
                       derived: tuple[TraceValues, frozenset[str]] | None) -> None:
        old = self._models.pop(model, None)
        if old is not None:
            self._retire(old)
        if derived is not None:
            self._models[model] = self._scope(*derived)

    # ---------------------------------------------------------------- internals

    def _scope(self, values: TraceValues, specified: frozenset[str]) -> SamplingScope:
        return SamplingScope(values, specified, next(self._batches), self._can_write,
                             self.config.mode)

    def _refresh(self) -> None:
        self._enabled = self._global.active or any(s.active for s in self._models.values())

    def _retire(self, scope: SamplingScope) -> None:
        scope.retired = True
        scope.active = False
        if scope.in_flight == 0 and scope.pending:
            self._flush(scope, indexed=scope.values.log_frequency != 0)

    def _flush(self, scope: SamplingScope, indexed: bool) -> None:
        scope.pending = 0
        if self._writer is not None:
            self._writer.flush(scope.batch, indexed)

    def _new_writer(self) -> TraceWriter:
        sink: TraceSink
        if self.config.mode is TraceMode.OPENTELEMETRY:
            from shoal.trace.otel import OtelExporter

            sink = OtelSink(OtelExporter(self.config.otel))
        else:
            sink = FileSink(self.trace_file)
        self._writer = TraceWriter(sink)
        return self._writer

    def close(self, timeout_s: float = 15.0) -> None:
        """At the frontend's exit (after its requests drained): write every batch still open,
        finish the file (or export the spans still queued)."""
        for scope in (self._global, *self._models.values()):
            self._retire(scope)
        self._enabled = False
        if self._writer is not None:
            self._writer.close(timeout_s)
