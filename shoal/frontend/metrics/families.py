"""Metric families of the model versions (Triton's ``nv_inference_*`` names and help texts,
labels ``model`` and ``version``), of the model lifecycle, and of the host CPU.

Per model version, from the broker's statistics (global: every frontend's requests):
success / failure (by ``reason``) counts, inference and execution counts, pending requests, and
the cumulative durations in µs (``counter_latencies``). Counters carry no ``_total`` suffix
(prometheus-cpp's naming, as Triton). From the repository snapshot: Triton's
``nv_model_load_duration_secs`` and shoal's own ``shoal_model_*`` lifecycle families. Triton's
pinned-memory pool gauges (always 0: shoal has no such pool).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Final

import psutil  # type: ignore[import-untyped]
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from shoal.frontend.metrics.exposition import counter_family
from shoal.messages import ModelStats, ModelVersionState, RepositorySnapshot

FAILURE_REASONS: Final = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

# (name, help, value of one model version)
_Counter = tuple[str, str, Callable[[ModelStats], int]]
_COUNTS: Final[tuple[_Counter, ...]] = (
    ("nv_inference_count",
     "Number of inferences performed (does not include cached requests)",
     lambda s: s.inference_count),
    ("nv_inference_exec_count",
     "Number of model executions performed (does not include cached requests)",
     lambda s: s.execution_count),
)
_DURATIONS: Final[tuple[_Counter, ...]] = (
    ("nv_inference_request_duration_us",
     "Cumulative inference request duration in microseconds (includes cached requests)",
     lambda s: s.success.ns // 1000),
    ("nv_inference_queue_duration_us",
     "Cumulative inference queuing duration in microseconds (includes cached requests)",
     lambda s: s.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     lambda s: s.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)",
     lambda s: s.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us",
     "Cumulative inference compute output duration in microseconds (does not include cached "
     "requests)", lambda s: s.compute_output.ns // 1000),
)


def failures_by_reason(stats: ModelStats) -> dict[str, int]:
    """Triton's four reasons, always present; failures the broker did not classify are OTHER."""
    counts = {reason: 0 for reason in FAILURE_REASONS}
    for reason, count in stats.fail_by_reason.items():
        counts[reason] = counts.get(reason, 0) + count
    unclassified = stats.fail.count - sum(counts.values())
    if unclassified > 0:
        counts["OTHER"] += unclassified
    return counts


def version_labels(stats: ModelStats) -> dict[str, str]:
    return {"model": stats.name, "version": str(stats.version)}


def _counter(name: str, text: str, value: Callable[[ModelStats], int],
             ordered: Sequence[ModelStats]) -> Metric:
    family = counter_family(name, text)
    for s in ordered:
        family.add_sample(name, version_labels(s), value(s))
    return family


def model_families(stats: Sequence[ModelStats], counter_latencies: bool = True
                   ) -> Iterator[Metric]:
    """The per-version families, versions sorted by (model, version)."""
    ordered = sorted(stats, key=lambda s: (s.name, s.version))
    yield _counter("nv_inference_request_success",
                   "Number of successful inference requests, all batch sizes",
                   lambda s: s.success.count, ordered)
    failures = counter_family("nv_inference_request_failure",
                              "Number of failed inference requests, all batch sizes")
    for s in ordered:
        for reason, count in failures_by_reason(s).items():
            # labels in name order, as Triton prints them (model, reason, version): clients and
            # Triton's own tests match the sample line as text
            labels = dict(sorted({**version_labels(s), "reason": reason}.items()))
            failures.add_sample("nv_inference_request_failure", labels, count)
    yield failures
    for name, text, value in _COUNTS:
        yield _counter(name, text, value, ordered)
    pending = GaugeMetricFamily(
        "nv_inference_pending_request_count",
        "Instantaneous number of pending requests awaiting execution per-model.",
        labels=("model", "version"))
    for s in ordered:
        pending.add_metric((s.name, str(s.version)), s.pending)
    yield pending
    if counter_latencies:
        for name, text, value in _DURATIONS:
            yield _counter(name, text, value, ordered)


def lifecycle_families(snapshot: RepositorySnapshot | None) -> Iterator[Metric]:
    """Triton's load time per ready version (the model's last successful load), and shoal's
    state per version (one series per state, 1 for the current one) and load events per model."""
    if snapshot is None:
        return
    infos = sorted(snapshot.models, key=lambda i: (i.name, i.version))
    loads = {s.name: s for s in snapshot.load_stats}
    load_time = GaugeMetricFamily("nv_model_load_duration_secs", "Model load time in seconds",
                                  labels=("model", "version"))
    for info in infos:
        record = loads.get(info.name)
        if info.state is ModelVersionState.READY and record is not None and record.loads:
            load_time.add_metric((info.name, str(info.version)), record.last_load_seconds)
    yield load_time
    state = GaugeMetricFamily("shoal_model_state",
                              "Model version state: 1 for the current state, 0 for the others",
                              labels=("model", "version", "state"))
    for info in infos:
        for each in ModelVersionState:
            state.add_metric((info.name, str(info.version), each.value), int(info.state is each))
    yield state
    events = sorted(snapshot.load_stats, key=lambda s: s.name)
    for name, text, field in (
            ("shoal_model_loads", "Successful loads and reloads of the model", "loads"),
            ("shoal_model_load_failures", "Failed loads and reloads of the model", "failures"),
            ("shoal_model_unloads", "Unloads of the model", "unloads")):
        family = counter_family(name, text)
        for s in events:
            family.add_sample(name, {"model": s.name}, getattr(s, field))
        yield family
    last = GaugeMetricFamily("shoal_model_last_load_duration_seconds",
                             "Seconds from the load request to ready, for the last successful "
                             "load", labels=("model",))
    for s in events:
        last.add_metric((s.name,), s.last_load_seconds)
    yield last


def pinned_memory_families() -> Iterator[Metric]:
    """Triton's pinned-memory pool gauges. shoal keeps no pinned (page-locked) host pool:
    tensors travel through POSIX shared memory, and a CUDA copy stages through the worker's
    own buffers. So both are 0, what Triton reports when it has no pool (e.g. with
    ``--pinned-memory-pool-byte-size=0``, or when its pool allocation fails)."""
    yield GaugeMetricFamily("nv_pinned_memory_pool_total_bytes",
                            "Pinned memory pool total memory size, in bytes", value=0)
    yield GaugeMetricFamily("nv_pinned_memory_pool_used_bytes",
                            "Pinned memory pool used memory size, in bytes", value=0)


def cpu_families() -> Iterator[Metric]:
    """Host CPU use since the previous scrape and memory, from psutil (Triton's names)."""
    memory = psutil.virtual_memory()
    yield GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]",
                            value=psutil.cpu_percent(interval=None) / 100.0)
    yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes",
                            value=memory.total)
    yield GaugeMetricFamily("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes",
                            value=memory.total - memory.available)
