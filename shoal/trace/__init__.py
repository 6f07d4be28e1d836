"""Request tracing, as tritonserver's trace extension (``--trace-config``, ``/v2/trace/setting``,
gRPC ``TraceSetting``).

A frontend samples requests (``sampling.Tracer``: every ``trace_rate``-th request of a model, up
to ``trace_count``) and follows a sampled one through the server with one clock,
``CLOCK_MONOTONIC`` (``time.monotonic_ns``, the same clock in every process, as Triton's
``steady_clock``): the frontend stamps the protocol and request ends, the broker the queue and the
dispatch, the worker the compute phases of the batch (``messages.TraceStamps`` carries the broker's
and worker's stamps back in the answer). A finished trace goes to a writer thread
(``writer.TraceWriter``) that formats it off the request path: Triton's JSON trace file
(``triton_format``, ``files``) or OpenTelemetry spans over OTLP/HTTP (``otel``).

Modules: ``config`` (start-up flags), ``values`` (the settings API: parsing, overrides),
``record`` (one request's trace), ``sampling`` (rate / count, the settings registry),
``triton_format`` / ``files`` (Triton's JSON and its files), ``otel`` (spans), ``writer``.
"""
