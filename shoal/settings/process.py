"""What each process holds of the settings: ``Settings`` (the supervisor's, every concern),
``BrokerSettings``, ``FrontendSettings`` and ``WorkerSettings`` (the concerns that process reads,
given to it typed: ``Settings.for_broker`` / ``for_frontends`` as JSON in its argv,
``for_workers`` inside its ``WorkerSpec``). ``settings_from_flags`` builds ``Settings`` from the
flat, flag-named fields the CLI parses."""

from __future__ import annotations

from typing import Any

import msgspec

from shoal.settings.concerns import (
    BackendSettings,
    ClientShmSettings,
    GrpcSettings,
    HttpSettings,
    InstanceSettings,
    LogSettings,
    MetricsSettings,
    ModelControlSettings,
    RateLimitSettings,
    ShmSettings,
    WorkerWatchSettings,
)


class WorkerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """A model instance's worker process: the server instance (segment names, lock, sockets),
    its shared-memory sizes, where backends are found and their ``--backend-config``, the
    logging flags, and whether client objects another uid owns may be mapped."""

    instance: InstanceSettings = InstanceSettings()
    log: LogSettings = LogSettings()
    shm: ShmSettings = ShmSettings()
    backend: BackendSettings = BackendSettings()
    client_shm: ClientShmSettings = ClientShmSettings()


class BrokerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The broker process: models, their loading and workers (``for_workers``)."""

    instance: InstanceSettings = InstanceSettings()
    log: LogSettings = LogSettings()
    shm: ShmSettings = ShmSettings()
    backend: BackendSettings = BackendSettings()
    model_control: ModelControlSettings = ModelControlSettings()
    worker_watch: WorkerWatchSettings = WorkerWatchSettings()
    rate_limit: RateLimitSettings = RateLimitSettings()
    client_shm: ClientShmSettings = ClientShmSettings()
    http_workers: int = 1           # frontend processes (a CPU instance's intra-op thread share)
    exit_timeout_secs: float = 30.0

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @staticmethod
    def from_json(data: bytes | str) -> BrokerSettings:
        return msgspec.json.decode(data, type=BrokerSettings)

    def for_workers(self) -> WorkerSettings:
        """What a worker process is given of these settings (``WorkerSpec.settings``)."""
        return WorkerSettings(instance=self.instance, log=self.log, shm=self.shm,
                              backend=self.backend, client_shm=self.client_shm)


class FrontendSettings(msgspec.Struct, frozen=True, kw_only=True):
    """A frontend process: its HTTP, gRPC and metrics endpoints and what they serve."""

    instance: InstanceSettings = InstanceSettings()
    log: LogSettings = LogSettings()
    shm: ShmSettings = ShmSettings()
    http: HttpSettings = HttpSettings()
    grpc: GrpcSettings = GrpcSettings()
    metrics: MetricsSettings = MetricsSettings()
    client_shm: ClientShmSettings = ClientShmSettings()
    model_control: ModelControlSettings = ModelControlSettings()
    server_id: str = "triton"       # --id: the "name" of the server metadata
    # --trace-config as given, (mode or "", setting, value); checked by the CLI, parsed by each
    # frontend (shoal/trace/config.py)
    trace_config: list[tuple[str, str, str]] = []
    # response cache (--cache-config local,size=N): bytes of cached responses, split evenly
    # between the http.workers frontends (each holds its own LRU); 0 = no cache
    response_cache_bytes: int = 0
    exit_timeout_secs: float = 30.0  # how long shutdown waits for in-flight requests

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @staticmethod
    def from_json(data: bytes | str) -> FrontendSettings:
        return msgspec.json.decode(data, type=FrontendSettings)


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Every concern: what the CLI parses and the supervisor holds."""

    instance: InstanceSettings = InstanceSettings()
    log: LogSettings = LogSettings()
    shm: ShmSettings = ShmSettings()
    backend: BackendSettings = BackendSettings()
    model_control: ModelControlSettings = ModelControlSettings()
    worker_watch: WorkerWatchSettings = WorkerWatchSettings()
    rate_limit: RateLimitSettings = RateLimitSettings()
    http: HttpSettings = HttpSettings()
    grpc: GrpcSettings = GrpcSettings()
    metrics: MetricsSettings = MetricsSettings()
    client_shm: ClientShmSettings = ClientShmSettings()
    server_id: str = "triton"
    trace_config: list[tuple[str, str, str]] = []
    response_cache_bytes: int = 0
    exit_timeout_secs: float = 30.0

    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @staticmethod
    def from_json(data: bytes | str) -> Settings:
        return msgspec.json.decode(data, type=Settings)

    def for_broker(self) -> BrokerSettings:
        """What the broker process is given (its argv)."""
        return BrokerSettings(
            instance=self.instance, log=self.log, shm=self.shm, backend=self.backend,
            model_control=self.model_control, worker_watch=self.worker_watch,
            rate_limit=self.rate_limit, client_shm=self.client_shm,
            http_workers=self.http.workers, exit_timeout_secs=self.exit_timeout_secs)

    def for_frontends(self) -> FrontendSettings:
        """What each frontend process is given (its argv)."""
        return FrontendSettings(
            instance=self.instance, log=self.log, shm=self.shm, http=self.http, grpc=self.grpc,
            metrics=self.metrics, client_shm=self.client_shm, model_control=self.model_control,
            server_id=self.server_id, trace_config=self.trace_config,
            response_cache_bytes=self.response_cache_bytes,
            exit_timeout_secs=self.exit_timeout_secs)

    def for_workers(self) -> WorkerSettings:
        """What a worker process is given (``WorkerSpec.settings``; the broker's own copy)."""
        return self.for_broker().for_workers()


# the flat, flag-named field of each setting -> (concern, field); concern "" = Settings' own
FLAT_FIELDS: dict[str, tuple[str, str]] = {
    "instance_id": ("instance", "instance_id"), "runtime_dir": ("instance", "runtime_dir"),
    **{f"log_{f}": ("log", f) for f in ("verbose", "info", "warning", "error", "format", "file")},
    "shm_segment_bytes": ("shm", "segment_bytes"),
    "shm_arena_max_bytes": ("shm", "arena_max_bytes"),
    "backend_directory": ("backend", "directory"), "backend_config": ("backend", "config"),
    "model_repositories": ("model_control", "repositories"),
    "model_control_mode": ("model_control", "mode"),
    "load_models": ("model_control", "load_models"),
    "repository_poll_secs": ("model_control", "repository_poll_secs"),
    "model_load_device_limits": ("model_control", "device_limits"),
    "model_load_device_margin_bytes": ("model_control", "device_margin_bytes"),
    "model_temp_root": ("model_control", "temp_root"),
    "strict_readiness": ("model_control", "strict_readiness"),
    "exit_on_error": ("model_control", "exit_on_error"),
    "model_config_name": ("model_control", "config_name"),
    "disable_auto_complete_config": ("model_control", "disable_auto_complete_config"),
    "execution_timeout_secs": ("worker_watch", "execution_timeout_secs"),
    "worker_heartbeat_timeout_secs": ("worker_watch", "heartbeat_timeout_secs"),
    "rate_limit": ("rate_limit", "mode"), "rate_limit_resources": ("rate_limit", "resources"),
    **{f"http_{f}": ("http", f) for f in HttpSettings.__struct_fields__},
    "allow_grpc": ("grpc", "enabled"),
    **{f"grpc_{f}": ("grpc", f) for f in GrpcSettings.__struct_fields__ if f != "enabled"},
    "allow_metrics": ("metrics", "enabled"),
    "allow_gpu_metrics": ("metrics", "allow_gpu"), "allow_cpu_metrics": ("metrics", "allow_cpu"),
    **{f"metrics_{f}": ("metrics", f) for f in MetricsSettings.__struct_fields__
       if f not in ("enabled", "allow_gpu", "allow_cpu")},
    "allow_client_shm": ("client_shm", "allowed"),
    **{f"client_shm_{f}": ("client_shm", f) for f in ClientShmSettings.__struct_fields__
       if f != "allowed"},
    **{f: ("", f) for f in ("server_id", "trace_config", "response_cache_bytes",
                            "exit_timeout_secs")},
}


def settings_from_flags(**flat: Any) -> Settings:
    """``Settings`` from flat, flag-named fields (``http_port=8000``, ``allow_grpc=False``,
    ``shm_segment_bytes=...``: the keys of ``FLAT_FIELDS``), as the CLI parses them; a name not
    there raises TypeError, a value of the wrong type msgspec.ValidationError."""
    nested: dict[str, Any] = {}
    for name, value in flat.items():
        if name not in FLAT_FIELDS:
            raise TypeError(f"settings_from_flags: unknown setting {name!r}")
        concern, field = FLAT_FIELDS[name]
        if concern:
            nested.setdefault(concern, {})[field] = value
        else:
            nested[field] = value
    return msgspec.convert(nested, Settings)
