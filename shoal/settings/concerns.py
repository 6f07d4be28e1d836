"""The settings of one concern each (HTTP, gRPC, shared memory, model control, ...): frozen
structs that ``Settings`` (``settings/process.py``) composes and each process is given the ones
it reads of. Field comments name the flags and the code that reads them."""

from __future__ import annotations

import enum

import msgspec


class ModelControlMode(enum.StrEnum):
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


class InstanceSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The server instance: set by the supervisor, not by flags."""

    instance_id: str = ""           # random, appears in every segment name: /shoal-<id>-...
    runtime_dir: str = ""           # holds the ipc:// sockets of this server instance

    @property
    def segment_prefix(self) -> str:
        """Every POSIX shm segment of this server instance starts with this name."""
        return f"/shoal-{self.instance_id}-"


class LogSettings(msgspec.Struct, frozen=True, kw_only=True):
    """--log-verbose, and tritonserver's --log-info / --log-warning / --log-error / --log-format /
    --log-file: the logging extension's starting settings (frontend/http/log_settings.py); the
    parent sends every process's output to ``file`` when it is set."""

    verbose: int = 0
    info: bool = True
    warning: bool = True
    error: bool = True
    format: str = "default"
    file: str = ""


class ShmSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Shared memory: each frontend and each worker owns an arena of segments of this size, and
    may grow to at most arena_max_bytes (allocation failure beyond it is a 503, never a grow)."""

    segment_bytes: int = 16 * 1024 * 1024
    arena_max_bytes: int = 1024 * 1024 * 1024


class BackendSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Where out-of-tree backends are found (--backend-directory) and --backend-config."""

    directory: str = ""
    # (backend, key, value); backend "" is the global form (e.g. default-max-batch-size=4)
    config: list[tuple[str, str, str]] = []

    def setting(self, backend: str, key: str, default: str = "") -> str:
        """Value of ``--backend-config=<backend>,<key>=<value>``; the global form applies to all."""
        found = default
        for b, k, v in self.config:
            if k == key and b in ("", backend):
                found = v
                if b == backend:
                    return v
        return found

    @property
    def default_max_batch_size(self) -> int:
        return int(self.setting("", "default-max-batch-size", "4"))


class ModelControlSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The model repositories and how their models are loaded (broker/lifecycle/)."""

    repositories: list[str] = []
    mode: ModelControlMode = ModelControlMode.NONE
    load_models: list[str] = []     # explicit mode: loaded at start ("*" = every model)
    repository_poll_secs: float = 15.0  # poll mode: seconds between repository scans
    # (device id, fraction): a device's ledger admits loads up to this fraction of its memory
    device_limits: list[tuple[int, float]] = []
    device_margin_bytes: int = 256 * 1024 * 1024  # added to each GPU instance's need
    # where load overrides (config + file:) are materialised; "" = <runtime_dir>/models
    temp_root: str = ""
    strict_readiness: bool = True
    exit_on_error: bool = True
    config_name: str = ""           # --model-config-name: configs/<name>.pbtxt where it exists
    disable_auto_complete_config: bool = False


class WorkerWatchSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Hang detection of the workers (the broker's)."""

    # an execution running longer than this fails its requests and the worker is replaced (per
    # model: config parameter shoal_execution_timeout_secs; 0 = no deadline); decoupled models:
    # the longest wait for their next response
    execution_timeout_secs: float = 600.0
    # a worker whose heartbeat (a thread, independent of execute) is silent this long is killed
    heartbeat_timeout_secs: float = 5.0


class RateLimitSettings(msgspec.Struct, frozen=True, kw_only=True):
    """--rate-limit: "off" or "execution_count" (broker/rate_limiter/); --rate-limit-resource
    flags as (name, count, device), device -1 = every device."""

    mode: str = "off"
    resources: list[tuple[str, int, int]] = []


class HttpSettings(msgspec.Struct, frozen=True, kw_only=True):
    port: int = 8000
    address: str = "0.0.0.0"
    workers: int = 1                # frontend processes sharing the HTTP port (SO_REUSEPORT)
    max_input_size: int = 64 * 1024 * 1024
    # --http-header-forward-pattern: request headers whose name matches become request
    # parameters (frontend/header_forward.py); "" forwards none
    header_forward_pattern: str = ""
    # slow and idle HTTP clients (frontend/http/guard.py): request line + headers must arrive
    # within header_timeout_secs of connecting (or of the request's first byte on a keep-alive
    # connection); a body that makes no progress for body_timeout_secs ends the request (408); a
    # keep-alive connection idle this long after a response is closed
    header_timeout_secs: float = 10.0
    body_timeout_secs: float = 30.0
    idle_timeout_secs: float = 30.0
    # per frontend process; beyond it new connections are answered 503 (health checks still 200)
    max_connections: int = 4096
    # restricted APIs (frontend/restricted.py): (category, header key, value) per restricted
    # category, from --http-restricted-api
    restricted_apis: list[tuple[str, str, str]] = []


class GrpcSettings(msgspec.Struct, frozen=True, kw_only=True):
    enabled: bool = True            # --allow-grpc
    port: int = 8001
    address: str = "0.0.0.0"
    # --grpc-use-ssl and its files (PEM); mutual: clients must present a certificate the root
    # certificate signed
    use_ssl: bool = False
    use_ssl_mutual: bool = False
    server_cert: str = ""
    server_key: str = ""
    root_cert: str = ""
    # --grpc-infer-response-compression-level: none | low | medium | high (any but none: gzip,
    # for clients that accept it)
    response_compression: str = "none"
    # --grpc-header-forward-pattern: as HttpSettings.header_forward_pattern, for metadata
    header_forward_pattern: str = ""
    # --grpc-restricted-protocol, as HttpSettings.restricted_apis (keys carry Triton's
    # "triton-grpc-protocol-" prefix already)
    restricted_protocols: list[tuple[str, str, str]] = []
    # gRPC limits (frontend/grpc/server.py); times in ms as tritonserver's --grpc-* flags; 0 for
    # the connection age/idle limits = none
    max_connections: int = 4096        # per frontend process
    max_concurrent_streams: int = 1024  # per connection (HTTP/2 SETTINGS)
    max_input_size: int = 2**31 - 1    # largest received message (Triton: INT32_MAX)
    keepalive_time_ms: int = 7_200_000
    keepalive_timeout_ms: int = 20_000
    keepalive_permit_without_calls: bool = False
    http2_max_pings_without_data: int = 2
    http2_min_recv_ping_interval_without_data_ms: int = 300_000
    http2_max_ping_strikes: int = 2
    max_connection_idle_ms: int = 0
    max_connection_age_ms: int = 0
    max_connection_age_grace_ms: int = 0


class MetricsSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The metrics port and its contents (frontend/metrics/config.py): --metrics-config settings,
    GPU gauges, the interval of the per-interval metrics (GPU readings, summary windows)."""

    enabled: bool = True            # --allow-metrics
    port: int = 8002
    address: str = ""               # --metrics-address; "" = the HTTP address
    counter_latencies: bool = True
    histogram_latencies: bool = False
    summary_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = (
        (0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
    allow_gpu: bool = True          # --allow-gpu-metrics
    allow_cpu: bool = True          # --allow-cpu-metrics: the host CPU and memory gauges
    interval_ms: int = 2000


class ClientShmSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The system/CUDA shared-memory extension (Triton's default since 2.69: off)."""

    allowed: bool = False           # --allow-client-shm
    max_regions: int = 1024
    max_bytes: int = 64 * 1024 * 1024 * 1024
    # --client-shm-allow-foreign-owner: register and map client objects another uid owns (off:
    # only the server's own uid's, shm/object_identity.py, shm/client_regions)
    allow_foreign_owner: bool = False
