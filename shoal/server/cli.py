"""``shoal`` command line. Flags are named as ``tritonserver`` names them where the concept is
the same; they are parsed once into ``Settings`` and never read again."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys

from shoal.frontend.metrics.config import parse_metrics_config
from shoal.frontend.response_cache.config import (
    CacheConfigError,
    cache_byte_size,
    parse_cache_setting,
)
from shoal.frontend.restricted import RestrictionError, parse_restrictions
from shoal.ops.top_args import add_top_arguments
from shoal.server.triton_flags import add_triton_flags, triton_settings
from shoal.settings import ModelControlMode, Settings, settings_from_flags
from shoal.trace.config import parse_trace_config, trace_config_arg

GRPC_INT_MAX = 2**31 - 1  # grpc channel arguments are C ints


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def parse_backend_config(text: str) -> tuple[str, str, str]:
    """``<backend>,<key>=<value>`` or the global ``<key>=<value>``."""
    backend, _, setting = text.partition(",") if "," in text else ("", "", text)
    key, sep, value = setting.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(
            f"--backend-config expects <backend>,<key>=<value> or <key>=<value>, got '{text}'")
    return backend, key, value


def parse_device_limit(text: str) -> tuple[int, float]:
    """``<device id>:<fraction>``, fraction in (0, 1] (Triton's --model-load-gpu-limit)."""
    device, sep, fraction = text.partition(":")
    try:
        device_id, limit = int(device), float(fraction)
    except ValueError:
        device_id, limit = -1, -1.0
    if not sep or device_id < 0 or not 0.0 < limit <= 1.0:
        raise argparse.ArgumentTypeError(
            f"--model-load-device-limit expects <device id>:<fraction in (0, 1]>, got '{text}'")
    return device_id, limit


def _cache_setting(text: str) -> tuple[str, str, str]:
    try:
        return parse_cache_setting(text)
    except CacheConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _rate_limit_resource(text: str) -> tuple[str, int, int]:
    from shoal.broker.rate_limiter.config import parse_resource_flag

    try:
        return parse_resource_flag(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _forward_pattern(text: str) -> str:
    from shoal.frontend.core.header_forward import compile_pattern

    try:
        compile_pattern(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _bool_flag(parser: argparse.ArgumentParser, name: str, default: bool, help_text: str) -> None:
    parser.add_argument(name, type=parse_bool, nargs="?", const=True, default=default,
                        metavar="BOOL", help=f"{help_text} (default {str(default).lower()})")


def _version() -> str:
    """The installed distribution's version (pyproject's), or "unknown" outside an install."""
    try:
        return importlib.metadata.version("shoal")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: a flag is taken only as spelled in full (tritonserver takes no
    # abbreviations either), so `--model-repo` is an error, not a silent prefix match
    parser = argparse.ArgumentParser(prog="shoal", description="Triton-compatible inference "
                                     "server: ZeroMQ broker, shared-memory workers.",
                                     allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"shoal {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model repository", allow_abbrev=False)
    serve.add_argument("--model-repository", "--model-store", dest="model_repository",
                       action="append", required=True, metavar="PATH",
                       help="model repository directory (repeatable)")
    serve.add_argument("--http-port", type=int, default=8000)
    serve.add_argument("--http-address", default="0.0.0.0")
    serve.add_argument("--http-workers", type=int, default=1, metavar="N",
                       help="frontend processes sharing the HTTP port via SO_REUSEPORT")
    serve.add_argument("--grpc-port", type=int, default=8001)
    serve.add_argument("--grpc-address", default="0.0.0.0")
    _bool_flag(serve, "--allow-grpc", True, "serve the gRPC endpoint on --grpc-port")
    serve.add_argument("--http-restricted-api", action="append", default=[],
                       metavar="CATEGORY[,CATEGORY...]:KEY=VALUE",
                       help="HTTP requests to these API categories need header KEY: VALUE, "
                       "else 403 (repeatable; a category in one group only)")
    serve.add_argument("--grpc-restricted-protocol", action="append", default=[],
                       metavar="CATEGORY[,CATEGORY...]:KEY=VALUE",
                       help="gRPC calls of these categories need metadata "
                       "triton-grpc-protocol-KEY: VALUE (repeatable)")
    _bool_flag(serve, "--allow-client-shm", False,
               "allow clients to register system/CUDA shared-memory regions")
    _bool_flag(serve, "--client-shm-allow-foreign-owner", False,
               "let clients register system shared-memory objects another user owns")
    serve.add_argument("--client-shm-max-regions", type=int, default=1024)
    serve.add_argument("--client-shm-max-bytes", type=int, default=64 * 1024**3,
                       help="most bytes of client regions mapped at once")
    serve.add_argument("--metrics-port", type=int, default=8002)
    _bool_flag(serve, "--allow-metrics", True, "serve Prometheus metrics on --metrics-port")
    serve.add_argument("--metrics-config", action="append", default=[], metavar="SETTING=VALUE",
                       help="counter_latencies, histogram_latencies, summary_latencies "
                       "(true/false) or summary_quantiles=Q:E,... (repeatable)")
    _bool_flag(serve, "--allow-gpu-metrics", True, "GPU gauges (NVML) on the metrics port")
    serve.add_argument("--metrics-interval-ms", type=int, default=2000, metavar="MS",
                       help="how often GPU readings and summary windows are refreshed")
    serve.add_argument("--model-control-mode", choices=[m.value for m in ModelControlMode],
                       default="none", help="none: load every model at start; explicit: load "
                       "--load-model models, then the load/unload API; poll: follow the "
                       "repository's changes every --repository-poll-secs")
    serve.add_argument("--load-model", action="append", default=[], metavar="NAME",
                       help="explicit mode: load this model at start (repeatable; '*' = all)")
    serve.add_argument("--repository-poll-secs", type=float, default=15.0,
                       help="poll mode: seconds between repository scans (default 15)")
    serve.add_argument("--model-load-device-limit", "--model-load-gpu-limit",
                       dest="model_load_device_limit", type=parse_device_limit,
                       action="append", default=[], metavar="DEVICE:FRACTION",
                       help="admit GPU loads on DEVICE up to FRACTION of its memory")
    serve.add_argument("--model-load-device-margin-bytes", type=int, default=256 * 1024**2,
                       help="device memory added to each GPU instance's need (default 256 MiB)")
    _bool_flag(serve, "--strict-readiness", True,
               "ready only when every model has a ready version")
    _bool_flag(serve, "--exit-on-error", True, "exit when a model fails to load at start")
    serve.add_argument("--exit-timeout-secs", type=float, default=30.0,
                       help="how long shutdown waits for in-flight requests")
    serve.add_argument("--model-execution-timeout-secs", type=float, default=600.0,
                       help="an execution running longer fails its requests and its worker is "
                       "replaced (per model: parameter shoal_execution_timeout_secs; 0 = none)")
    serve.add_argument("--worker-heartbeat-timeout-secs", type=float, default=5.0,
                       help="a worker silent this long (stopped, wedged) is killed and replaced")
    serve.add_argument("--log-verbose", type=int, default=0)
    serve.add_argument("--trace-config", type=trace_config_arg, action="append", default=[],
                       metavar="[MODE,]SETTING=VALUE",
                       help="request tracing, as tritonserver: level=TIMESTAMPS|TENSORS|OFF, "
                       "rate=N (1000), count=N (-1), mode=triton|opentelemetry, "
                       "triton,file=PATH, triton,log-frequency=N (0), opentelemetry,url=URL, "
                       "opentelemetry,resource=KEY=VALUE (repeatable)")
    serve.add_argument("--backend-directory", default="",
                       help="directory searched for out-of-tree backends")
    serve.add_argument("--backend-config", type=parse_backend_config, action="append",
                       default=[], metavar="[BACKEND,]KEY=VALUE")
    _bool_flag(serve, "--disable-auto-complete-config", False,
               "do not run backends' auto_complete_config")
    serve.add_argument("--http-max-input-size", type=int, default=64 * 1024 * 1024,
                       help="largest request body, also after decompression (bytes); a "
                       "larger Content-Length is answered 413 before the body is read")
    serve.add_argument("--http-header-forward-pattern", type=_forward_pattern, default="",
                       metavar="REGEX", help="HTTP request headers whose name matches (case-"
                       "insensitive unless the pattern starts with (?-i)) are passed to the "
                       "model as request parameters")
    serve.add_argument("--grpc-header-forward-pattern", type=_forward_pattern, default="",
                       metavar="REGEX", help="as --http-header-forward-pattern, for gRPC "
                       "metadata")
    serve.add_argument("--http-header-timeout-secs", type=float, default=10.0,
                       help="a client must send its request line and headers within this "
                       "long of connecting (or of a keep-alive request's first byte): 408, close")
    serve.add_argument("--http-body-timeout-secs", type=float, default=30.0,
                       help="a request body that makes no progress this long ends: 408, close")
    serve.add_argument("--http-idle-timeout-secs", type=float, default=30.0,
                       help="an idle keep-alive connection is closed after this long")
    serve.add_argument("--http-max-connections", type=int, default=4096, metavar="N",
                       help="open HTTP connections per frontend process; beyond it new "
                       "connections get 503 (health checks are still answered)")
    serve.add_argument("--grpc-max-connections", type=int, default=4096, metavar="N",
                       help="open gRPC connections per frontend process (more are closed)")
    serve.add_argument("--grpc-max-concurrent-streams", type=int, default=1024, metavar="N",
                       help="concurrent calls per gRPC connection; clients queue the rest")
    serve.add_argument("--grpc-max-input-size", type=int, default=2**31 - 1,
                       help="largest gRPC message received (bytes; default INT32_MAX as Triton)")
    serve.add_argument("--grpc-keepalive-time", type=int, default=7_200_000, metavar="MS",
                       help="the server pings a connection idle this long (ms)")
    serve.add_argument("--grpc-keepalive-timeout", type=int, default=20_000, metavar="MS",
                       help="a ping not acknowledged within this long closes the connection")
    _bool_flag(serve, "--grpc-keepalive-permit-without-calls", False,
               "accept (and send) keepalive pings on connections without calls")
    serve.add_argument("--grpc-http2-max-pings-without-data", type=int, default=2,
                       help="pings the server sends with no data in between (0 = no limit)")
    serve.add_argument("--grpc-http2-min-recv-ping-interval-without-data", type=int,
                       default=300_000, metavar="MS",
                       help="a client ping sooner than this after the last one (no data in "
                       "between) is a strike")
    serve.add_argument("--grpc-http2-max-ping-strikes", type=int, default=2,
                       help="strikes tolerated before GOAWAY ENHANCE_YOUR_CALM (0 = no limit)")
    serve.add_argument("--grpc-max-connection-idle", type=int, default=0, metavar="MS",
                       help="a connection without calls this long gets GOAWAY (0 = never)")
    serve.add_argument("--grpc-max-connection-age", type=int, default=0, metavar="MS",
                       help="a connection this old gets GOAWAY (0 = never)")
    serve.add_argument("--grpc-max-connection-age-grace", type=int, default=0, metavar="MS",
                       help="calls still open after GOAWAY for age are ended after this long "
                       "(0 = never)")
    serve.add_argument("--rate-limit", choices=["off", "execution_count"], default="off",
                       help="execution_count: an instance executes only while the resources of "
                       "its instance group's rate_limiter are free (as tritonserver)")
    serve.add_argument("--rate-limit-resource", type=_rate_limit_resource, action="append",
                       default=[], metavar="NAME:COUNT[:DEVICE]",
                       help="copies of a rate limiter resource (per device, or on DEVICE); "
                       "repeatable")
    serve.add_argument("--shm-segment-byte-size", type=int, default=16 * 1024 * 1024,
                       help="size of each shared-memory segment of a process's arena")
    serve.add_argument("--shm-arena-byte-size", type=int, default=1024 * 1024 * 1024,
                       help="most shared memory one process's arena may use")
    serve.add_argument("--cache-config", type=_cache_setting, action="append", default=[],
                       metavar="CACHE,KEY=VALUE",
                       help="response cache, as tritonserver: local,size=N (bytes; models opt "
                       "in with response_cache { enable: true })")
    serve.add_argument("--response-cache-byte-size", type=int, default=None, metavar="N",
                       help="deprecated form of --cache-config local,size=N")
    add_triton_flags(serve, _bool_flag)
    top = sub.add_parser("top", help="live view of a running server (its ops dashboard)",
                         allow_abbrev=False)
    add_top_arguments(top)
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The Settings of ``serve``'s flags; raises ValueError for a tritonserver flag shoal
    cannot serve as given (``triton_flags``)."""
    triton, _ = triton_settings(args)
    trace_from_old_flags = triton.pop("trace_config")
    if args.disable_auto_complete_config:
        triton["disable_auto_complete_config"] = True
    return settings_from_flags(
        **triton,
        model_repositories=list(args.model_repository), http_port=args.http_port,
        http_address=args.http_address, http_workers=max(1, args.http_workers),
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port, allow_metrics=args.allow_metrics,
        allow_gpu_metrics=args.allow_gpu_metrics, metrics_interval_ms=args.metrics_interval_ms,
        **parse_metrics_config(args.metrics_config),
        model_control_mode=ModelControlMode(args.model_control_mode),
        load_models=list(args.load_model), repository_poll_secs=args.repository_poll_secs,
        model_load_device_limits=list(args.model_load_device_limit),
        model_load_device_margin_bytes=args.model_load_device_margin_bytes,
        strict_readiness=args.strict_readiness, exit_on_error=args.exit_on_error,
        exit_timeout_secs=args.exit_timeout_secs, log_verbose=args.log_verbose,
        trace_config=[*args.trace_config, *trace_from_old_flags],
        execution_timeout_secs=args.model_execution_timeout_secs,
        worker_heartbeat_timeout_secs=args.worker_heartbeat_timeout_secs,
        backend_directory=args.backend_directory, backend_config=list(args.backend_config),
        rate_limit=args.rate_limit, rate_limit_resources=list(args.rate_limit_resource),
        http_max_input_size=args.http_max_input_size,
        http_header_forward_pattern=args.http_header_forward_pattern,
        grpc_header_forward_pattern=args.grpc_header_forward_pattern,
        http_header_timeout_secs=args.http_header_timeout_secs,
        http_body_timeout_secs=args.http_body_timeout_secs,
        http_idle_timeout_secs=args.http_idle_timeout_secs,
        http_max_connections=args.http_max_connections,
        grpc_max_connections=args.grpc_max_connections,
        grpc_max_concurrent_streams=args.grpc_max_concurrent_streams,
        grpc_max_input_size=args.grpc_max_input_size,
        grpc_keepalive_time_ms=args.grpc_keepalive_time,
        grpc_keepalive_timeout_ms=args.grpc_keepalive_timeout,
        grpc_keepalive_permit_without_calls=args.grpc_keepalive_permit_without_calls,
        grpc_http2_max_pings_without_data=args.grpc_http2_max_pings_without_data,
        grpc_http2_min_recv_ping_interval_without_data_ms=(
            args.grpc_http2_min_recv_ping_interval_without_data),
        grpc_http2_max_ping_strikes=args.grpc_http2_max_ping_strikes,
        grpc_max_connection_idle_ms=args.grpc_max_connection_idle,
        grpc_max_connection_age_ms=args.grpc_max_connection_age,
        grpc_max_connection_age_grace_ms=args.grpc_max_connection_age_grace,
        allow_client_shm=args.allow_client_shm,
        client_shm_max_regions=args.client_shm_max_regions,
        client_shm_allow_foreign_owner=args.client_shm_allow_foreign_owner,
        client_shm_max_bytes=args.client_shm_max_bytes,
        grpc_address=args.grpc_address, allow_grpc=args.allow_grpc,
        http_restricted_apis=parse_restrictions(args.http_restricted_api,
                                                flag="--http-restricted-api", grpc=False),
        grpc_restricted_protocols=parse_restrictions(args.grpc_restricted_protocol,
                                                     flag="--grpc-restricted-protocol", grpc=True),
        shm_segment_bytes=args.shm_segment_byte_size,
        shm_arena_max_bytes=args.shm_arena_byte_size,
        response_cache_bytes=cache_byte_size(args.cache_config, args.response_cache_byte_size),
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "top":
        from shoal.ops.top import run_top

        return run_top(args)
    if args.load_model and args.model_control_mode != ModelControlMode.EXPLICIT.value:
        parser.error("--load-model needs --model-control-mode=explicit")
    if "*" in args.load_model and len(args.load_model) > 1:
        parser.error("--load-model=* loads every model and must be the only --load-model")
    if args.model_execution_timeout_secs < 0:
        parser.error("--model-execution-timeout-secs must be 0 (none) or more")
    if args.worker_heartbeat_timeout_secs <= 0:
        parser.error("--worker-heartbeat-timeout-secs must be greater than 0")
    if args.repository_poll_secs <= 0:
        parser.error("--repository-poll-secs must be greater than 0")
    if args.metrics_interval_ms <= 0:
        parser.error("--metrics-interval-ms must be greater than 0")
    try:
        parse_metrics_config(args.metrics_config)
    except ValueError as exc:
        parser.error(str(exc))
    for flag in ("--http-header-timeout-secs", "--http-body-timeout-secs",
                 "--http-idle-timeout-secs", "--http-max-connections",
                 "--grpc-max-connections", "--grpc-max-concurrent-streams",
                 "--grpc-max-input-size", "--grpc-keepalive-time", "--grpc-keepalive-timeout"):
        if getattr(args, flag[2:].replace("-", "_")) <= 0:
            parser.error(f"{flag} must be greater than 0")
    for flag in ("--grpc-http2-max-pings-without-data",
                 "--grpc-http2-min-recv-ping-interval-without-data",
                 "--grpc-http2-max-ping-strikes", "--grpc-max-connection-idle",
                 "--grpc-max-connection-age", "--grpc-max-connection-age-grace"):
        if getattr(args, flag[2:].replace("-", "_")) < 0:
            parser.error(f"{flag} must be 0 or more")
    for flag in ("--grpc-max-input-size", "--grpc-keepalive-time", "--grpc-keepalive-timeout",
                 "--grpc-http2-min-recv-ping-interval-without-data",
                 "--grpc-max-connection-idle", "--grpc-max-connection-age",
                 "--grpc-max-connection-age-grace", "--grpc-max-connections",
                 "--grpc-max-concurrent-streams"):
        if getattr(args, flag[2:].replace("-", "_")) > GRPC_INT_MAX:
            parser.error(f"{flag} must be at most {GRPC_INT_MAX} (a grpc channel argument)")
    try:
        triton, no_effect = triton_settings(args)
        parse_trace_config([*args.trace_config, *triton["trace_config"]])
    except ValueError as exc:
        parser.error(str(exc))
    try:
        cache_byte_size(args.cache_config, args.response_cache_byte_size)
    except CacheConfigError as exc:
        parser.error(str(exc))
    try:
        settings = settings_from_args(args)
    except RestrictionError as exc:
        parser.error(str(exc))
    if settings.log.file:
        try:
            send_output_to(settings.log.file)
        except OSError as exc:
            parser.error(f"--log-file {settings.log.file}: {exc.strerror}")
    for note in no_effect:
        print(f"shoal: {note}", file=sys.stderr, flush=True)
    from shoal.server.supervisor import run_supervisor

    return run_supervisor(settings)


def send_output_to(path: str) -> None:
    """--log-file: this process's standard output and error (and so every child's, which
    inherit them) append to ``path`` from now on."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
