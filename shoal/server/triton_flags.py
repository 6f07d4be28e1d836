"""tritonserver 2.51's command-line flags that ``shoal serve`` has no flag of its own for, so a
Triton command line (a systemd unit, a Helm chart) starts shoal unchanged.

Three kinds (``add_triton_flags`` adds them to the serve parser, ``triton_settings`` reads them):

- served: the flag means here what it means in Triton (``--id``, ``--log-*``,
  ``--metrics-address``, ``--allow-cpu-metrics``, ``--model-config-name``, ``--grpc-use-ssl`` and
  its files, ``--grpc-infer-response-compression-level``, ``--strict-model-config``, and the old
  ``--trace-file``/``-level``/``-rate``/``-count``/``-log-frequency`` forms of ``--trace-config``);
- no effect here: accepted, and named once in the start-up log with the reason (Triton's pinned
  and CUDA memory pools, thread counts of Triton's own pools, peer access, host policies, repo
  agents; shoal's processes and shared memory take their place);
- not served: accepted only at the value that leaves the feature off (``--allow-sagemaker``,
  ``--allow-vertex-ai``, ``--model-namespacing``, ``--allow-http``); turning one on stops the
  start with a message saying so, instead of serving something else than asked.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any, Final

# flag -> why it has no effect in shoal (the start-up log says so when one is given)
NO_EFFECT: Final[dict[str, str]] = {
    "--pinned-memory-pool-byte-size": "shoal keeps no pinned host pool: tensors travel in POSIX "
                                      "shared memory",
    "--cuda-memory-pool-byte-size": "CUDA workers size their own workspace pool (see "
                                    "--backend-config ...,workspace-bytes)",
    "--cuda-virtual-address-size": "CUDA workers size their own workspace pool",
    "--min-supported-compute-capability": "a model's framework checks its own device support",
    "--buffer-manager-thread-count": "shoal has no buffer manager threads",
    "--enable-peer-access": "workers copy device tensors through their own device",
    "--host-policy": "instances are placed by instance_group and the thread policy",
    "--cache-directory": "shoal writes no model cache",
    "--repoagent-directory": "shoal runs no repository agents",
    "--http-thread-count": "HTTP is served by --http-workers event-loop processes",
    "--grpc-infer-allocation-pool-size": "gRPC answers are written without a pooled allocator",
    "--model-load-thread-count": "each model instance loads in its own worker process, at once",
    "--model-load-retry-count": "a failed load is reported at once (load it again through the "
                                "repository API)",
    "--reuse-http-port": "the HTTP port is always bound with SO_REUSEPORT (--http-workers)",
    "--reuse-grpc-port": "the gRPC port is always bound with SO_REUSEPORT",
    "--sagemaker-port": "the SageMaker endpoint is not served",
    "--sagemaker-safe-port-range": "the SageMaker endpoint is not served",
    "--sagemaker-thread-count": "the SageMaker endpoint is not served",
    "--vertex-ai-port": "the Vertex AI endpoint is not served",
    "--vertex-ai-thread-count": "the Vertex AI endpoint is not served",
    "--vertex-ai-default-model": "the Vertex AI endpoint is not served",
}
_REPEATABLE: Final = frozenset({"--cuda-memory-pool-byte-size", "--host-policy",
                                "--cuda-virtual-address-size"})
# flag -> (the value that leaves it off, why shoal does not serve it on)
NOT_SERVED: Final[dict[str, tuple[bool, str]]] = {
    "--allow-sagemaker": (False, "shoal does not serve the SageMaker endpoint"),
    "--allow-vertex-ai": (False, "shoal does not serve the Vertex AI endpoint"),
    "--model-namespacing": (False, "shoal does not namespace models by repository: model "
                                   "names must be unique across --model-repository paths"),
    "--allow-http": (True, "shoal always serves HTTP (its health endpoints and the frontend "
                           "supervision use it); bind it to 127.0.0.1 with --http-address"),
}
COMPRESSION_LEVELS: Final = ("none", "low", "medium", "high")
LOG_FORMATS: Final = ("default", "ISO8601")


def add_triton_flags(serve: argparse.ArgumentParser, bool_flag: Callable[..., None]) -> None:
    """Add the flags above to ``serve`` (``bool_flag(parser, name, default, help)`` as the
    serve parser's own boolean flags)."""
    group = serve.add_argument_group("tritonserver flags", "accepted so a Triton command line "
                                     "starts unchanged; see docs/triton-differences.md")
    group.add_argument("--id", dest="server_id", default="triton",
                       help="the server's name in the server metadata (default triton)")
    bool_flag(group, "--log-info", True, "log INFO messages")
    bool_flag(group, "--log-warning", True, "log WARNING messages")
    bool_flag(group, "--log-error", True, "log ERROR messages")
    group.add_argument("--log-format", choices=LOG_FORMATS, default="default")
    group.add_argument("--log-file", default="", metavar="PATH",
                       help="append every process's log to PATH instead of standard error")
    group.add_argument("--metrics-address", default="", metavar="ADDRESS",
                       help="bind the metrics port here (default: --http-address)")
    bool_flag(group, "--allow-cpu-metrics", True, "host CPU and memory gauges on /metrics")
    group.add_argument("--model-config-name", default="", metavar="NAME",
                       help="read <model>/configs/NAME.pbtxt instead of config.pbtxt where "
                       "that file exists")
    bool_flag(group, "--strict-model-config", False,
              "true: do not auto-complete model configs (as --disable-auto-complete-config)")
    bool_flag(group, "--grpc-use-ssl", False, "serve gRPC over TLS")
    bool_flag(group, "--grpc-use-ssl-mutual", False,
              "serve gRPC over TLS and require client certificates")
    group.add_argument("--grpc-server-cert", default="", metavar="PEM")
    group.add_argument("--grpc-server-key", default="", metavar="PEM")
    group.add_argument("--grpc-root-cert", default="", metavar="PEM")
    group.add_argument("--grpc-infer-response-compression-level", choices=COMPRESSION_LEVELS,
                       default="none", help="compress gRPC answers (gzip) for clients that "
                       "accept it")
    for old in ("file", "level", "rate", "count", "log-frequency"):
        group.add_argument(f"--trace-{old}", dest=f"trace_old_{old.replace('-', '_')}",
                           action="append", default=[], metavar="VALUE",
                           help=f"old form of --trace-config triton,{old}=VALUE")
    for flag in NO_EFFECT:
        group.add_argument(flag, dest=_dest(flag), default=None, metavar="VALUE",
                           action="append" if flag in _REPEATABLE else "store",
                           help="accepted; no effect in shoal")
    for flag, (off, _) in NOT_SERVED.items():
        bool_flag(group, flag, off, f"accepted only as {str(off).lower()}")


def _dest(flag: str) -> str:
    return "triton_" + flag.lstrip("-").replace("-", "_")


def triton_settings(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The Settings fields the flags set, and the start-up log lines about flags with no effect.
    A not-served feature turned on, or TLS without its files, raises ValueError saying so."""
    for flag, (off, why) in NOT_SERVED.items():
        if getattr(args, flag.lstrip("-").replace("-", "_")) != off:
            raise ValueError(f"{flag}={str(not off).lower()} is not supported: {why}")
    use_ssl = args.grpc_use_ssl or args.grpc_use_ssl_mutual
    if use_ssl:
        _check_tls_files(args)
    # Triton's old trace flags: file and log frequency are the triton mode's, the rest global
    trace = [("triton" if old in ("file", "log_frequency") else "", old.replace("_", "-"), value)
             for old in ("file", "level", "rate", "count", "log_frequency")
             for value in getattr(args, f"trace_old_{old}")]
    notes = [f"{flag} has no effect in shoal: {why}" for flag, why in NO_EFFECT.items()
             if getattr(args, _dest(flag)) not in (None, [])]
    fields: dict[str, Any] = {
        "server_id": args.server_id, "log_info": args.log_info,
        "log_warning": args.log_warning, "log_error": args.log_error,
        "log_format": args.log_format, "log_file": args.log_file,
        "metrics_address": args.metrics_address, "allow_cpu_metrics": args.allow_cpu_metrics,
        "model_config_name": args.model_config_name,
        "grpc_use_ssl": use_ssl, "grpc_use_ssl_mutual": args.grpc_use_ssl_mutual,
        "grpc_server_cert": args.grpc_server_cert, "grpc_server_key": args.grpc_server_key,
        "grpc_root_cert": args.grpc_root_cert,
        "grpc_response_compression": args.grpc_infer_response_compression_level,
        "trace_config": trace,
    }
    if args.strict_model_config:
        fields["disable_auto_complete_config"] = True
    return fields, notes


def _check_tls_files(args: argparse.Namespace) -> None:
    needed = [("--grpc-server-cert", args.grpc_server_cert),
              ("--grpc-server-key", args.grpc_server_key)]
    if args.grpc_use_ssl_mutual:
        needed.append(("--grpc-root-cert", args.grpc_root_cert))
    for flag, path in needed:
        if not path:
            raise ValueError(f"--grpc-use-ssl needs {flag}")
        if not os.path.isfile(path):
            raise ValueError(f"{flag} {path}: no such file")
