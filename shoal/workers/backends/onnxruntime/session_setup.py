"""ONNX Runtime session options and execution providers from a model config, with the names
Triton's onnxruntime backend reads.

Config ``parameters`` (string values): ``intra_op_thread_count``, ``inter_op_thread_count``
(0 = ONNX Runtime's default), ``execution_mode`` (0 sequential, 1 parallel; anything else is an
error), ``enable_mem_arena``, ``enable_mem_pattern`` ("1"/"0", "true"/"false"), and any key
starting with ``session.`` is passed as a session config entry (Triton passes
``session.use_device_allocator_for_initializers``; shoal passes them all, e.g.
``session.intra_op.allow_spinning``). ``memory.enable_memory_arena_shrinkage`` is a run option
(see ``run_options``). ``optimization { graph { level } }``: -1 basic, 1 extended, 2 none,
anything else all optimizations (Triton's mapping).

Threads: without ``intra_op_thread_count`` (or ``--backend-config=onnxruntime,
intra_op_thread_count=N``) a CPU instance gets the server's thread policy
(``shoal/broker/thread_policy.py``: the cores left after the frontends and the broker, shared
among every model's CPU instances, at least 1); an instance without one (GPU) gets an equal
share of the CPUs this process may run on among the model's CPU instances (at least 1), so the
default two instances of an ONNX model do not each start a pool as large as the machine.
``inter_op_thread_count`` defaults to 1 (it only matters in parallel execution mode).

Providers: ``CPUExecutionProvider`` always, last. A KIND_GPU instance adds
``CUDAExecutionProvider`` on its device (or ``CANNExecutionProvider`` on an ``npu:N`` device).
``optimization { execution_accelerators }`` as in Triton: ``gpu_execution_accelerator``
``tensorrt`` (before CUDA; its parameters mapped as Triton maps them), ``cuda`` (its parameters
passed as CUDA provider options), and shoal's ``cann``; ``cpu_execution_accelerator``
``openvino``. A provider the installed onnxruntime lacks fails the load naming the package that
has it; an unknown accelerator name fails as in Triton.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from tritonclient.grpc.model_config_pb2 import ModelInstanceGroup

from shoal.errors import ErrorCode, ShoalError, invalid_arg

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

ProviderEntry = tuple[str, dict[str, str]]

_BOOLEANS: Final = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False}
_PACKAGE_OF_PROVIDER: Final = {
    "CUDAExecutionProvider": "onnxruntime-gpu",
    "TensorrtExecutionProvider": "onnxruntime-gpu (with TensorRT installed)",
    "OpenVINOExecutionProvider": "onnxruntime-openvino",
    "CANNExecutionProvider": "onnxruntime-cann",
}
# Triton's TensorRT accelerator keys -> ONNX Runtime TensorRT provider options (besides the
# trt_* keys, which pass unchanged).
_TRT_RENAMED: Final = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
}
_GRAPH_LEVELS: Final = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}


def config_parameters(config: ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def session_options(ort: Any, config: ModelConfig, backend_settings: Mapping[str, str],
                    default_intra: int = 0) -> Any:
    """``ort.SessionOptions`` for one instance of the model (see the module docstring);
    ``default_intra`` is the thread policy's count (0: none)."""
    params = config_parameters(config)
    options = ort.SessionOptions()
    level = int(config.optimization.graph.level) if config.optimization.HasField("graph") else 0
    options.graph_optimization_level = getattr(
        ort.GraphOptimizationLevel, _GRAPH_LEVELS.get(level, "ORT_ENABLE_ALL"))
    mode = _int_parameter(params, "execution_mode", 0)
    if mode not in (0, 1):
        raise invalid_arg("Invalid configuration value provided. Expected values for "
                          f"execution_mode are 0 or 1 but got {mode} .")
    options.execution_mode = (ort.ExecutionMode.ORT_SEQUENTIAL if mode == 0
                              else ort.ExecutionMode.ORT_PARALLEL)
    intra = _thread_count(params, backend_settings, "intra_op_thread_count")
    if intra <= 0:
        intra = default_intra if default_intra > 0 else default_intra_threads(config)
    options.intra_op_num_threads = intra
    inter = _thread_count(params, backend_settings, "inter_op_thread_count")
    options.inter_op_num_threads = inter if inter > 0 else 1
    if "enable_mem_arena" in params:
        options.enable_cpu_mem_arena = _bool_parameter(params, "enable_mem_arena")
    if "enable_mem_pattern" in params:
        options.enable_mem_pattern = _bool_parameter(params, "enable_mem_pattern")
    for key, value in params.items():
        if key.startswith("session."):
            options.add_session_config_entry(key, value)
    return options


def run_options(ort: Any, config: ModelConfig) -> Any:
    """``ort.RunOptions`` for every run (``memory.enable_memory_arena_shrinkage``)."""
    options = ort.RunOptions()
    shrinkage = config_parameters(config).get("memory.enable_memory_arena_shrinkage")
    if shrinkage:
        options.add_run_config_entry("memory.enable_memory_arena_shrinkage", shrinkage)
    return options


def default_intra_threads(config: ModelConfig) -> int:
    """The usable CPUs divided among the model's CPU instances, at least 1."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    instances = sum(max(int(group.count), 1) for group in config.instance_group
                    if group.kind != ModelInstanceGroup.KIND_GPU)  # those use their device
    return max(1, (cpus or 1) // max(instances, 1))


def execution_providers(ort: Any, config: ModelConfig, kind: str, device: str,
                        device_id: int) -> list[ProviderEntry]:
    """The providers for an instance, in priority order, each checked against the installed
    onnxruntime (see the module docstring)."""
    accelerators = config.optimization.execution_accelerators
    entries: list[ProviderEntry] = []
    if kind == "GPU":
        on_npu = device.startswith("npu")
        base = ("CANNExecutionProvider" if on_npu else "CUDAExecutionProvider",
                {"device_id": str(device_id)})
        for accelerator in accelerators.gpu_execution_accelerator:
            entries.append(_gpu_accelerator(accelerator, device_id, base))
        if not any(name == base[0] for name, _ in entries):
            entries.append(base)
    elif accelerators.gpu_execution_accelerator:
        names = [a.name for a in accelerators.gpu_execution_accelerator]
        raise invalid_arg(f"gpu_execution_accelerator {names} requested for a {kind} instance; "
                          "use instance_group { kind: KIND_GPU }")
    for accelerator in accelerators.cpu_execution_accelerator:
        if accelerator.name != "openvino":
            raise invalid_arg(f"unknown Execution Accelerator '{accelerator.name}' is requested")
        entries.append(("OpenVINOExecutionProvider",
                        {"device_type": "CPU", **dict(accelerator.parameters)}))
    entries.append(("CPUExecutionProvider", {}))
    available = set(ort.get_available_providers())
    for name, _ in entries:
        if name not in available:
            package = _PACKAGE_OF_PROVIDER.get(name, "an onnxruntime build with it")
            raise ShoalError(ErrorCode.UNSUPPORTED,
                             f"execution provider {name} is not available in the installed "
                             f"onnxruntime (available: {', '.join(sorted(available))}); "
                             f"install {package}")
    return entries


def _gpu_accelerator(accelerator: Any, device_id: int, base: ProviderEntry) -> ProviderEntry:
    params = dict(accelerator.parameters)
    if accelerator.name == "tensorrt":
        options = {"device_id": str(device_id)}
        for key, value in params.items():
            if key == "precision_mode":
                if value.upper() == "FP16":
                    options["trt_fp16_enable"] = "True"
                elif value.upper() == "INT8":
                    options["trt_int8_enable"] = "True"
                elif value.upper() != "FP32":
                    raise invalid_arg(f"unsupported precision mode '{value}' is requested")
            else:
                options[_TRT_RENAMED.get(str(key), str(key))] = str(value)
        return "TensorrtExecutionProvider", options
    if accelerator.name == "cuda" and base[0] == "CUDAExecutionProvider":
        return "CUDAExecutionProvider", {**base[1], **params}
    if accelerator.name == "cann" and base[0] == "CANNExecutionProvider":
        return "CANNExecutionProvider", {**base[1], **params}
    raise invalid_arg(f"unknown Execution Accelerator '{accelerator.name}' is requested")


def _thread_count(params: Mapping[str, str], settings: Mapping[str, str], key: str) -> int:
    if key in params:
        return _int_parameter(params, key, 0, minimum=0)
    return _int_parameter(settings, key, 0, minimum=0)


def _int_parameter(params: Mapping[str, str], key: str, default: int,
                   minimum: int | None = None) -> int:
    text = params.get(key, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise invalid_arg(f"parameter '{key}' must be an integer, got '{text}'") from None
    if minimum is not None and value < minimum:
        raise invalid_arg(f"parameter '{key}' must be >= {minimum}, got {value}")
    return value


def _bool_parameter(params: Mapping[str, str], key: str) -> bool:
    text = params[key].strip().lower()
    if text not in _BOOLEANS:
        raise invalid_arg(f"parameter '{key}' must be 1/0 or true/false, got '{params[key]}'")
    return _BOOLEANS[text]
