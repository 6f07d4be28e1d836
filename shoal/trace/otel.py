"""``--trace-config mode=opentelemetry``: each trace becomes OpenTelemetry spans, exported over
OTLP/HTTP (protobuf) by the SDK's batch span processor, as Triton's OpenTelemetry mode does
(tracer.cc):

- ``InferRequest`` (root, kind SERVER): from the first to the last stamp, the protocol stamps
  (HTTP_* / GRPC_*) as events;
- ``<model name>`` (child): REQUEST_START to REQUEST_END, events REQUEST_START, QUEUE_START,
  REQUEST_END; attributes ``triton.model_name``, ``triton.model_version``, ``triton.trace_id``,
  ``triton.trace_parent_id`` (0: no ensembles), ``triton.request_id`` when the client gave one;
- ``compute`` (child of the model span): COMPUTE_START to COMPUTE_END with the compute events.

Span and event times are wall-clock ns, as OpenTelemetry wants: the monotonic stamp plus the
offset between the two clocks when the trace is exported (Triton does the same at trace start).
TENSORS are not exported (Triton's OpenTelemetry mode does not support them either). The SDK is
imported only in this mode.

Threads: ``export`` runs on the tracer's writer thread; the SDK's processor exports on its own.
"""

from __future__ import annotations

import time
from typing import Any

from shoal.trace.config import OtelOptions
from shoal.trace.record import (
    COMPUTE_END,
    COMPUTE_INPUT_END,
    COMPUTE_OUTPUT_START,
    COMPUTE_START,
    QUEUE_START,
    REQUEST_END,
    REQUEST_START,
    RequestTrace,
)

TRACER_NAME = "triton-server"  # Triton's kTritonTracer
_MODEL_EVENTS = (REQUEST_START, QUEUE_START, REQUEST_END)
_COMPUTE_EVENTS = (COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END)


class OtelExporter:
    def __init__(self, options: OtelOptions) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self._provider = TracerProvider(resource=Resource.create(options.resource_attributes()),
                                        shutdown_on_exit=False)
        self._provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=options.url),
            max_queue_size=options.bsp_max_queue_size,
            schedule_delay_millis=options.bsp_schedule_delay_ms,
            max_export_batch_size=options.bsp_max_export_batch_size))
        self._tracer = self._provider.get_tracer(TRACER_NAME)

    def export(self, trace: RequestTrace) -> None:
        from opentelemetry import trace as trace_api

        if not trace.stamps:
            return
        offset = time.time_ns() - time.monotonic_ns()
        first: dict[str, int] = {}
        for name, ns in trace.stamps:
            first.setdefault(name, ns + offset)
        start, end = trace.stamps[0][1] + offset, trace.stamps[-1][1] + offset
        server = trace_api.SpanKind.SERVER
        root = self._tracer.start_span("InferRequest", kind=server, start_time=start)
        for name, ns in trace.stamps:
            if name.startswith(("HTTP_", "GRPC_")):
                root.add_event(name, timestamp=ns + offset)
        if REQUEST_START in first:
            attributes: dict[str, Any] = {
                "triton.model_name": trace.model_name,
                "triton.model_version": trace.model_version,
                "triton.trace_id": trace.trace_id, "triton.trace_parent_id": 0}
            if trace.request_id:
                attributes["triton.request_id"] = trace.request_id
            model = self._tracer.start_span(
                trace.model_name, context=trace_api.set_span_in_context(root), kind=server,
                start_time=first[REQUEST_START], attributes=attributes)
            _events(model, first, _MODEL_EVENTS)
            if COMPUTE_START in first:
                compute = self._tracer.start_span(
                    "compute", context=trace_api.set_span_in_context(model), kind=server,
                    start_time=first[COMPUTE_START])
                _events(compute, first, _COMPUTE_EVENTS)
                compute.end(end_time=first.get(COMPUTE_END, end))
            model.end(end_time=first.get(REQUEST_END, end))
        root.end(end_time=end)

    def close(self) -> None:
        """Export what is queued, then stop (bounded by the exporter's timeout)."""
        self._provider.shutdown()


def _events(span: Any, first: dict[str, int], names: tuple[str, ...]) -> None:
    for name in names:
        if name in first:
            span.add_event(name, timestamp=first[name])
