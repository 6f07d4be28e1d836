"""The model config's ``parameters`` as Triton's openvino backend reads them (string values,
upper-case keys; values compared without case):

- ``PERFORMANCE_HINT``: ``LATENCY``, ``THROUGHPUT`` or ``CUMULATIVE_THROUGHPUT``;
- ``NUM_STREAMS``: ``AUTO``, ``NUMA`` or a number;
- ``INFERENCE_NUM_THREADS``, ``COMPILATION_NUM_THREADS``: non-negative numbers (0 lets
  OpenVINO choose); without ``INFERENCE_NUM_THREADS`` an instance gets its share of the CPUs
  (``threads.default_inference_threads``), not OpenVINO's all-cores default;
- ``HINT_BF16``: ``YES`` (inference precision bf16 on CPUs that have it);
- ``CPU_EXTENSION_PATH``: a shared library of custom layers, added to the OpenVINO core;
- ``SKIP_OV_DYNAMIC_BATCHSIZE``, ``ENABLE_BATCH_PADDING``, ``RESHAPE_IO_LAYERS``: ``YES`` turns
  them on (anything else is off, as in Triton); see ``model_setup`` and ``backend``.

A bad value fails the load with INVALID_ARG and Triton's message. Other keys are ignored, as
Triton ignores them. A property the installed CPU plugin does not support (OpenVINO 2025+ has
no ``COMPILATION_NUM_THREADS`` on the CPU) is logged and ignored at load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shoal.errors import invalid_arg
from shoal.workers.backends.openvino.threads import default_inference_threads

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

_PERFORMANCE_HINTS = ("latency", "throughput", "cumulative_throughput")


@dataclass(frozen=True)
class OpenvinoOptions:
    """``compile_properties`` are set on the core's CPU device before the model is compiled
    (OpenVINO property names and values); the flags steer the backend."""

    compile_properties: dict[str, Any] = field(default_factory=dict)
    cpu_extension_path: str = ""
    skip_dynamic_batch_size: bool = False
    enable_batch_padding: bool = False
    reshape_io_layers: bool = False


def config_parameters(config: ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def openvino_options(config: ModelConfig, policy_threads: int = 0) -> OpenvinoOptions:
    """The options of model ``config`` (see the module docstring); ``policy_threads`` is the
    server's thread policy for the instance (0: none). Raises INVALID_ARG."""
    params = config_parameters(config)
    properties: dict[str, Any] = {}
    hint = _value(params, "PERFORMANCE_HINT")
    if hint:
        if hint not in _PERFORMANCE_HINTS:
            raise invalid_arg("expected the parameter 'PERFORMANCE_HINT' to be "
                              f"LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT, got {hint}")
        properties["PERFORMANCE_HINT"] = hint.upper()
    streams = _value(params, "NUM_STREAMS")
    if streams:
        if streams not in ("auto", "numa") and not streams.isdigit():
            raise invalid_arg("expected the parameter 'NUM_STREAMS' to be either "
                              f"AUTO/NUMA/<int_value>, got {streams}")
        properties["NUM_STREAMS"] = streams.upper() if not streams.isdigit() else int(streams)
    threads = _count(params, "INFERENCE_NUM_THREADS")
    properties["INFERENCE_NUM_THREADS"] = (threads if threads is not None
                                           else default_inference_threads(config, policy_threads))
    compile_threads = _count(params, "COMPILATION_NUM_THREADS")
    if compile_threads is not None:
        properties["COMPILATION_NUM_THREADS"] = compile_threads
    bf16 = _value(params, "HINT_BF16")
    if bf16:
        if bf16 != "yes":
            raise invalid_arg(f"expected the parameter 'HINT_BF16' to be YES, got {bf16}")
        properties["INFERENCE_PRECISION_HINT"] = "bf16"
    return OpenvinoOptions(
        compile_properties=properties,
        cpu_extension_path=params.get("CPU_EXTENSION_PATH", "").strip(),
        skip_dynamic_batch_size=_flag(params, "SKIP_OV_DYNAMIC_BATCHSIZE"),
        enable_batch_padding=_flag(params, "ENABLE_BATCH_PADDING"),
        reshape_io_layers=_flag(params, "RESHAPE_IO_LAYERS"))


def _value(params: dict[str, str], key: str) -> str:
    return params.get(key, "").strip().lower()


def _count(params: dict[str, str], key: str) -> int | None:
    value = _value(params, key)
    if not value:
        return None
    if not value.isdigit():
        raise invalid_arg(f"expected the parameter '{key}' to be a non-negative number, "
                          f"got {value}")
    return int(value)


def _flag(params: dict[str, str], key: str) -> bool:
    return _value(params, key) == "yes"
