"""Server settings: parsed once by the CLI (``server/cli.py``) into ``Settings`` and passed down
to every process as JSON (``to_json``/``from_json``). Nothing below the entry functions reads the
environment or argv.

Names follow ``tritonserver``'s flags where the concept is the same.
"""

from __future__ import annotations

import enum

import msgspec


class ModelControlMode(enum.StrEnum):
    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


class WorkerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The part of ``Settings`` a model instance's worker process uses, typed inside its
    ``WorkerSpec`` (``Settings.for_workers``): the server instance (segment names, lock,
    sockets), its shared-memory sizes, where backends are found and their
    ``--backend-config``, and the logging flags."""

    instance_id: str = ""
    runtime_dir: str = ""
    shm_segment_bytes: int = 16 * 1024 * 1024
    shm_arena_max_bytes: int = 1024 * 1024 * 1024
    backend_directory: str = ""
    backend_config: list[tuple[str, str, str]] = []
    log_verbose: int = 0
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_format: str = "default"
    # --client-shm-allow-foreign-owner: map client objects another uid owns (shm/client_regions)
    client_shm_allow_foreign_owner: bool = False

    @property
    def segment_prefix(self) -> str:
        """Every POSIX shm segment of this server instance starts with this name."""
        return f"/shoal-{self.instance_id}-"


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    model_repositories: list[str]
    http_port: int = 8000
    http_address: str = "0.0.0.0"
    http_workers: int = 1           # frontend processes sharing the HTTP port (SO_REUSEPORT)
    grpc_port: int = 8001
    metrics_port: int = 8002
    allow_metrics: bool = True
    # metrics port contents (frontend/metrics/config.py): --metrics-config settings, GPU gauges,
    # the interval of the per-interval metrics (GPU readings, summary windows)
    metrics_counter_latencies: bool = True
    metrics_histogram_latencies: bool = False
    metrics_summary_latencies: bool = False
    metrics_summary_quantiles: tuple[tuple[float, float], ...] = (
        (0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
    allow_gpu_metrics: bool = True
    allow_cpu_metrics: bool = True  # --allow-cpu-metrics: the host CPU and memory gauges
    metrics_address: str = ""       # --metrics-address; "" = http_address
    metrics_interval_ms: int = 2000
    model_control_mode: ModelControlMode = ModelControlMode.NONE
    load_models: list[str] = []     # explicit mode: loaded at start ("*" = every model)
    repository_poll_secs: float = 15.0  # poll mode: seconds between repository scans
    # (device id, fraction): a device's ledger admits loads up to this fraction of its memory
    model_load_device_limits: list[tuple[int, float]] = []
    model_load_device_margin_bytes: int = 256 * 1024 * 1024  # added to each GPU instance's need
    # where load overrides (config + file:) are materialised; "" = <runtime_dir>/models
    model_temp_root: str = ""
    strict_readiness: bool = True
    exit_on_error: bool = True
    exit_timeout_secs: float = 30.0
    # hang detection: an execution running longer than this fails its requests and the worker is
    # replaced (per model: config parameter shoal_execution_timeout_secs; 0 = no deadline);
    # decoupled models: the longest wait for their next response
    execution_timeout_secs: float = 600.0
    # a worker whose heartbeat (a thread, independent of execute) is silent this long is killed
    worker_heartbeat_timeout_secs: float = 5.0
    log_verbose: int = 0
    # tritonserver's --log-info / --log-warning / --log-error / --log-format / --log-file: the
    # logging extension's starting settings (frontend/http/log_settings.py); the parent sends
    # every process's output to log_file when it is set
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_format: str = "default"
    log_file: str = ""
    server_id: str = "triton"       # --id: the "name" of the server metadata
    model_config_name: str = ""     # --model-config-name: configs/<name>.pbtxt where it exists
    # --grpc-use-ssl and its files (PEM); mutual: clients must present a certificate the root
    # certificate signed
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False
    grpc_server_cert: str = ""
    grpc_server_key: str = ""
    grpc_root_cert: str = ""
    # --grpc-infer-response-compression-level: none | low | medium | high (any but none: gzip,
    # for clients that accept it)
    grpc_response_compression: str = "none"
    # --trace-config as given, (mode or "", setting, value); checked by the CLI, parsed by each
    # frontend (shoal/trace/config.py)
    trace_config: list[tuple[str, str, str]] = []
    backend_directory: str = ""
    # (backend, key, value); backend "" is the global form (e.g. default-max-batch-size=4)
    backend_config: list[tuple[str, str, str]] = []
    disable_auto_complete_config: bool = False
    # --rate-limit: "off" or "execution_count" (broker/rate_limiter/); --rate-limit-resource
    # flags as (name, count, device), device -1 = every device
    rate_limit: str = "off"
    rate_limit_resources: list[tuple[str, int, int]] = []
    http_max_input_size: int = 64 * 1024 * 1024
    # --http-header-forward-pattern / --grpc-header-forward-pattern: request headers whose
    # name matches become request parameters (frontend/header_forward.py); "" forwards none
    http_header_forward_pattern: str = ""
    grpc_header_forward_pattern: str = ""
    # slow and idle HTTP clients (frontend/http/guard.py): request line + headers must arrive
    # within http_header_timeout_secs of connecting (or of the request's first byte on a
    # keep-alive connection); a body that makes no progress for http_body_timeout_secs ends
    # the request (408); a keep-alive connection idle this long after a response is closed
    http_header_timeout_secs: float = 10.0
    http_body_timeout_secs: float = 30.0
    http_idle_timeout_secs: float = 30.0
    # per frontend process; beyond it new connections are answered 503 (health checks still 200)
    http_max_connections: int = 4096
    # system/CUDA shared-memory extension (Triton's default since 2.69: off)
    allow_client_shm: bool = False
    client_shm_max_regions: int = 1024
    client_shm_max_bytes: int = 64 * 1024 * 1024 * 1024
    # register and map client objects another uid owns (off: only the server's own uid's,
    # shm/object_identity.py)
    client_shm_allow_foreign_owner: bool = False
    grpc_address: str = "0.0.0.0"
    allow_grpc: bool = True
    # restricted APIs (frontend/restricted.py): (category, header key, value) per restricted
    # category, from --http-restricted-api / --grpc-restricted-protocol (gRPC keys carry
    # Triton's "triton-grpc-protocol-" prefix already)
    http_restricted_apis: list[tuple[str, str, str]] = []
    grpc_restricted_protocols: list[tuple[str, str, str]] = []
    # gRPC limits (frontend/grpc/server.py); times in ms as tritonserver's --grpc-* flags; 0 for
    # the connection age/idle limits = none
    grpc_max_connections: int = 4096        # per frontend process
    grpc_max_concurrent_streams: int = 1024  # per connection (HTTP/2 SETTINGS)
    grpc_max_input_size: int = 2**31 - 1    # largest received message (Triton: INT32_MAX)
    grpc_keepalive_time_ms: int = 7_200_000
    grpc_keepalive_timeout_ms: int = 20_000
    grpc_keepalive_permit_without_calls: bool = False
    grpc_http2_max_pings_without_data: int = 2
    grpc_http2_min_recv_ping_interval_without_data_ms: int = 300_000
    grpc_http2_max_ping_strikes: int = 2
    grpc_max_connection_idle_ms: int = 0
    grpc_max_connection_age_ms: int = 0
    grpc_max_connection_age_grace_ms: int = 0
    # shared memory: each frontend and each worker owns an arena of segments of this size, and
    # may grow to at most arena_max_bytes (allocation failure beyond it is a 503, never a grow).
    shm_segment_bytes: int = 16 * 1024 * 1024
    shm_arena_max_bytes: int = 1024 * 1024 * 1024
    # response cache (--cache-config local,size=N): bytes of cached responses, split evenly
    # between the http_workers frontends (each holds its own LRU); 0 = no cache
    response_cache_bytes: int = 0
    # runtime: set by the supervisor, not by flags
    instance_id: str = ""           # random, appears in every segment name: /shoal-<id>-...
    runtime_dir: str = ""           # holds the ipc:// sockets of this server instance

    def backend_setting(self, backend: str, key: str, default: str = "") -> str:
        """Value of ``--backend-config=<backend>,<key>=<value>``; the global form applies to all."""
        found = default
        for b, k, v in self.backend_config:
            if k == key and b in ("", backend):
                found = v
                if b == backend:
                    return v
        return found

    @property
    def default_max_batch_size(self) -> int:
        return int(self.backend_setting("", "default-max-batch-size", "4"))

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @staticmethod
    def from_json(data: bytes | str) -> Settings:
        return msgspec.json.decode(data, type=Settings)

    @property
    def segment_prefix(self) -> str:
        """Every POSIX shm segment of this server instance starts with this name."""
        return f"/shoal-{self.instance_id}-"

    def for_workers(self) -> WorkerSettings:
        """What a worker process is given of these settings (``WorkerSpec.settings``)."""
        return WorkerSettings(
            instance_id=self.instance_id, runtime_dir=self.runtime_dir,
            shm_segment_bytes=self.shm_segment_bytes,
            shm_arena_max_bytes=self.shm_arena_max_bytes,
            backend_directory=self.backend_directory, backend_config=self.backend_config,
            log_verbose=self.log_verbose, log_info=self.log_info, log_warning=self.log_warning,
            log_error=self.log_error, log_format=self.log_format,
            client_shm_allow_foreign_owner=self.client_shm_allow_foreign_owner)
