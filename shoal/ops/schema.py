"""The ops document served at ``GET :8002/dashboard/api/stats`` (and pushed on the live feed),
and the history at ``/dashboard/api/history``. Plain msgspec Structs, encoded once per sample.

Compatibility contract: ``SCHEMA_VERSION`` goes up when a field is removed or changes meaning;
fields may be added without a bump. Times are Unix seconds, sizes bytes, latencies µs. A figure
that cannot be known (no request in the window, a process that vanished mid-sample) is null.
The README's "Ops dashboard" section documents every field as a table.
"""

from __future__ import annotations

from typing import Final

import msgspec

SCHEMA_VERSION: Final = 1


class ProcessStats(msgspec.Struct, kw_only=True):
    """One process of the server. ``key`` is stable across restarts of the same slot
    (``frontend 1``, ``worker mlp:1:mlp_0@cpu``), ``pid`` is not."""

    key: str
    role: str  # supervisor | broker | frontend | worker | autocomplete | other
    label: str  # what a person reads: "frontend 0", "worker mlp v1 mlp_0 (cpu)"
    pid: int
    ppid: int
    cpu_percent: float  # of one core, since the previous sample (0.0 on the first)
    rss_bytes: int
    threads: int
    open_fds: int
    uptime_s: float
    restarts: int  # frontends: pid changes seen by the sampler; workers: the broker's count
    shm_bytes: int  # the process's own shoal segments in /dev/shm (apparent size)
    frontend_index: int | None = None
    model: str | None = None
    version: int | None = None
    instance: str | None = None
    device: str | None = None  # cpu | gpu:N | model


class BatchSizeCount(msgspec.Struct, kw_only=True):
    batch_size: int
    executions: int  # since the version was loaded
    recent: int  # in the latency window


class LatencySummary(msgspec.Struct, kw_only=True):
    """Percentiles over the last ``window_s`` seconds, from the broker's histograms (bucket
    deltas, linear inside a bucket). ``count``: requests that ended in the window."""

    window_s: float
    count: int
    request_p50_us: float | None = None
    request_p99_us: float | None = None
    queue_p50_us: float | None = None
    queue_p99_us: float | None = None
    compute_p50_us: float | None = None
    compute_p99_us: float | None = None


class ModelVersionStats(msgspec.Struct, kw_only=True):
    name: str
    version: int
    state: str  # READY | UNAVAILABLE | LOADING | UNLOADING | UNKNOWN
    reason: str
    platform: str
    instances: int  # configured instances (instance_group), 0 for ensembles
    queue_depth: int  # requests waiting for an instance
    in_flight: int  # requests sent to a worker and not answered yet
    requests_per_s: float  # requests that ended (success or failure) per second
    inferences_per_s: float  # rows (batch elements) per second
    errors_per_s: float
    success_count: int
    fail_count: int
    rejections: int  # failures with reason REJECTED (queue full, timeouts)
    fail_by_reason: dict[str, int]
    batch_sizes: list[BatchSizeCount]
    latency: LatencySummary
    instance_restarts: dict[str, int]
    loads: int = 0
    load_failures: int = 0
    last_load_seconds: float = 0.0


class SegmentOwner(msgspec.Struct, kw_only=True):
    """Server segments in /dev/shm summed per owning process (``owner`` is the process key,
    or ``unknown`` for a segment whose owner is not running)."""

    owner: str
    pid: int | None
    kind: str  # frontend input arena | worker output arena | broker state
    segments: int
    bytes: int  # apparent size (what is mapped)
    resident_bytes: int  # pages actually allocated


class ClientRegionStats(msgspec.Struct, kw_only=True):
    """A client-registered shared-memory region (Triton's extensions)."""

    name: str
    kind: str  # system | cuda
    key: str  # system: the POSIX object name; cuda: ""
    offset: int
    byte_size: int
    device_id: int | None = None


class SharedMemoryStats(msgspec.Struct, kw_only=True):
    total_bytes: int
    total_resident_bytes: int
    owners: list[SegmentOwner]
    client_regions: list[ClientRegionStats]


class LlmStats(msgspec.Struct, kw_only=True):
    """An ``llm``-backend model version (its executor figures summed over its instances,
    ``ops/llm_figures.py``). Rates since the previous sample; percentiles over the last
    ``window_s`` seconds (TTFT and inter-token latency are measured in the worker as each
    response leaves it)."""

    name: str
    version: int
    kv_blocks_used: int
    kv_blocks_free: int
    active_requests: int  # in the executor's running batch
    tokens_per_s: float  # generated tokens sent
    queued_requests: int = 0  # waiting to be admitted to the batch
    kv_blocks_max: int = 0
    kv_blocks_reused: int = 0  # taken from the prefix cache, since load
    prompt_tokens_per_s: float = 0.0
    prompt_tokens: int = 0  # since load
    generation_tokens: int = 0  # since load
    window_s: float = 0.0
    first_tokens: int = 0  # requests whose first token left in the window
    ttft_p50_us: float | None = None
    ttft_p99_us: float | None = None
    itl_p50_us: float | None = None
    itl_p99_us: float | None = None
    kv_pool_bytes: int = 0
    weights_bytes: int = 0


class DeviceHolderStats(msgspec.Struct, kw_only=True):
    model: str
    part: str  # weights | kv_pool (llm backend) | workspace | margin | model (undivided)
    bytes: int


class DeviceMemoryStats(msgspec.Struct, kw_only=True):
    """One GPU in the broker's device-memory ledger: what loads reserve on it (admission
    estimates, README "Model control"), not a reading of the device."""

    device: int
    capacity_bytes: int | None  # null: unknown size (admission unchecked)
    limit_bytes: int | None  # the share loads may reserve (--model-load-device-limit)
    reserved_bytes: int
    holders: list[DeviceHolderStats]


class ServerInfo(msgspec.Struct, kw_only=True):
    instance_id: str
    sampler_pid: int  # frontend 0: it samples and serves this document
    sampler_started: float  # a restart of frontend 0 starts the history (and counts) afresh
    ready: bool
    exiting: bool


class StatsDocument(msgspec.Struct, kw_only=True):
    schema_version: int
    time: float
    interval_s: float
    sample_ms: float  # wall time of this sample, the wait for the broker's statistics included
    sample_cpu_ms: float  # CPU time of the sampler's own work (psutil, /dev/shm, figures)
    server: ServerInfo
    processes: list[ProcessStats]
    models: list[ModelVersionStats]
    shared_memory: SharedMemoryStats
    llm: list[LlmStats]
    errors: list[str]  # figures that could not be collected in this sample, and why
    devices: list[DeviceMemoryStats] = []  # the device-memory ledger, per visible GPU


class ProcessSeries(msgspec.Struct, kw_only=True):
    label: str
    cpu_percent: list[float | None]
    rss_bytes: list[int | None]


class ModelSeries(msgspec.Struct, kw_only=True):
    label: str
    requests_per_s: list[float | None]
    request_p99_us: list[float | None]
    queue_depth: list[int | None]
    in_flight: list[int | None]


class HistoryDocument(msgspec.Struct, kw_only=True):
    """Columnar: every list is aligned with ``time`` (oldest first); null where the process or
    model version did not exist at that sample."""

    schema_version: int
    interval_s: float
    time: list[float]
    processes: dict[str, ProcessSeries]
    models: dict[str, ModelSeries]
