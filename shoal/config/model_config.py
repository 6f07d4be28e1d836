"""Triton model configuration: parse (pbtxt), complete and validate, and answer questions about
a config. Its JSON forms, in and out, are ``model_config_json``'s (re-exported here).

The config object is Triton's own protobuf (``tritonclient.grpc.model_config_pb2.ModelConfig``), so
every field Triton accepts is accepted here. ``normalize_config`` follows Triton core's
NormalizeModelConfig + NormalizeInstanceGroup + ValidateModelConfig + ValidateInstanceGroup +
ValidateModelIOConfig (core ``src/model_config_utils.cc``). Every error is INVALID_ARG with the
message ``"<source>: <field path>: <problem>"``, where ``source`` is a repository-relative name such
as ``"add_sub/config.pbtxt"`` (never an absolute path).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, Final

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb
from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.config.model_config_checks import (
    ENSEMBLE_PLATFORM,
    TENSORRT_PLATFORM,
    WILDCARD_DIM,
    check_batch_ios,
    check_ensemble,
    check_enum_values,
    check_ios,
    check_sequence_controls,
    check_warmup,
)
from shoal.config.model_config_checks import config_error as _error
from shoal.config.model_config_json import config_from_json as config_from_json
from shoal.config.model_config_json import config_to_json as config_to_json
from shoal.dtypes import config_to_wire
from shoal.errors import invalid_arg
from shoal.messages import TensorSpec

SEQUENCE_IDLE_DEFAULT_MICROSECONDS: Final = 1_000_000

# Triton's platform <-> backend pairs (core constants.h, GetBackendTypeFromPlatform).
_BACKEND_OF_PLATFORM: Final = {
    "pytorch_libtorch": "pytorch",
    "torch_aoti": "pytorch",  # a PyTorch 2 model.pt2 (AOTInductor package or exported program)
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
}
_PLATFORM_OF_BACKEND: Final = {
    "pytorch": "pytorch_libtorch", "onnxruntime": "onnxruntime_onnx", "tensorrt": "tensorrt_plan",
}
# default_model_filename filled in by Triton's AutoCompleteBackendFields.
_DEFAULT_MODEL_FILENAME: Final = {
    "python": "model.py", "pytorch": "model.pt", "onnxruntime": "model.onnx",
    "tensorrt": "model.plan", "openvino": "model.xml",
}
# Platforms whose default model file is not their backend's (keyed by platform).
_PLATFORM_MODEL_FILENAME: Final = {
    "tensorflow_savedmodel": "model.savedmodel", "tensorflow_graphdef": "model.graphdef",
    "torch_aoti": "model.pt2",
}
# Backends whose CPU instance groups default to count 2 (core SetDefaultInstanceCount).
_TWO_CPU_INSTANCE_BACKENDS: Final = frozenset({"tensorflow", "onnxruntime"})
# Instances of one model, all groups together: each is a worker process (not a Triton limit).
# Without a bound, ``count: 2147483647`` made the broker's loop build that many slots.
MAX_MODEL_INSTANCES: Final = 1024
_KIND_NAMES: Final = {pb.ModelInstanceGroup.KIND_CPU: "CPU", pb.ModelInstanceGroup.KIND_GPU: "GPU",
                      pb.ModelInstanceGroup.KIND_MODEL: "MODEL"}


# ------------------------------------------------------------------ parsing


def parse_config_text(text: str, source: str) -> ModelConfig:
    """pbtxt -> ModelConfig. A syntax error names ``source`` and the line/column of the fault."""
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        problem = str(exc)
        line, column = exc.GetLine(), exc.GetColumn()
        if line is not None:
            problem = problem.removeprefix(f"{line}:{column} : ")
            raise invalid_arg(f"{source}: line {line} column {column}: {problem}") from None
        raise invalid_arg(f"{source}: {problem}") from None
    except ValueError as exc:  # a number the field cannot hold (an enum beyond int32): no line
        raise invalid_arg(f"{source}: {exc}") from None
    return config


def load_config_file(path: str, *, source: str | None = None) -> ModelConfig | None:
    """Read and parse a config.pbtxt; None when the file does not exist. ``source`` names the file
    in errors (default: ``<model dir name>/<file name>``, never the absolute path)."""
    if source is None:
        source = os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise invalid_arg(f"{source}: cannot be read: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid_arg(f"{source}: not valid UTF-8 text (byte {exc.start})") from None
    return parse_config_text(text, source)


# ------------------------------------------------------------------ queries


def backend_name(config: ModelConfig) -> str:
    """``config.backend``, else the backend implied by ``config.platform``; "" when unknown
    (an ensemble has no backend)."""
    if config.backend:
        return str(config.backend)
    return _BACKEND_OF_PLATFORM.get(config.platform, "")


def platform_name(config: ModelConfig) -> str:
    """The ``platform`` reported in model metadata: the config platform, else the backend."""
    return str(config.platform or backend_name(config))


def _tensor_spec(io: Any, optional: bool) -> TensorSpec:
    return TensorSpec(
        name=io.name,
        datatype=config_to_wire(pb.DataType.Name(io.data_type)),
        dims=list(io.dims),
        optional=optional,
        reshape=list(io.reshape.shape) if io.HasField("reshape") else None,
    )


def tensor_specs(config: ModelConfig) -> tuple[list[TensorSpec], list[TensorSpec]]:
    inputs = [_tensor_spec(io, bool(io.optional)) for io in config.input]
    outputs = [_tensor_spec(io, False) for io in config.output]
    return inputs, outputs


def is_decoupled(config: ModelConfig) -> bool:
    return bool(config.model_transaction_policy.decoupled)


def instance_names(config: ModelConfig) -> list[tuple[str, str, int, int]]:
    """One (instance name, kind, device id, group index) per model instance of a normalized
    config, in Triton's order: per group, per count ``c``, per listed GPU. The name is Triton's
    ``<group name>_<c>``; the instances of one KIND_GPU group on different GPUs share the name
    and differ by device id (as in Triton)."""
    instances: list[tuple[str, str, int, int]] = []
    for index, group in enumerate(config.instance_group):
        kind = _KIND_NAMES.get(group.kind)
        if kind is None:
            raise invalid_arg(f"instance_group[{index}].kind: "
                              f"{pb.ModelInstanceGroup.Kind.Name(group.kind)} is not resolved")
        devices = list(group.gpus) if kind == "GPU" else [0]
        for c in range(group.count):
            instances.extend((f"{group.name}_{c}", kind, device, index) for device in devices)
    return instances


def full_shape(dims: Sequence[int], max_batch_size: int) -> list[int]:
    """The shape clients see: ``[-1] + dims`` for a batching model, else ``dims``."""
    return [WILDCARD_DIM, *dims] if max_batch_size > 0 else list(dims)


# ------------------------------------------------------------------ normalization


def normalize_config(config: ModelConfig, *, model_name: str, source: str,
                     default_max_batch_size: int = 4, gpu_count: int = 0) -> ModelConfig:
    """Return a completed and validated copy of ``config`` (the input is not modified).

    ``gpu_count`` is the number of visible accelerators (ids 0..gpu_count-1).
    ``default_max_batch_size`` is Triton's ``default-max-batch-size`` backend setting; like
    Triton's NormalizeModelConfig this function never changes ``max_batch_size`` (only a
    backend's auto-complete applies that default), so it is accepted for symmetry only.
    """
    del default_max_batch_size
    completed = ModelConfig()
    completed.CopyFrom(config)
    check_enum_values(completed, source)
    _complete_identity(completed, model_name, source)
    if completed.max_batch_size < 0:
        raise _error(source, "max_batch_size", f"must be >= 0, got {completed.max_batch_size}")
    if not completed.HasField("version_policy"):
        completed.version_policy.latest.num_versions = 1
    _normalize_dynamic_batching(completed, source)
    _normalize_sequence_batching(completed, source)
    if completed.HasField("ensemble_scheduling"):
        check_ensemble(completed, source)
        # Triton's normalization gives an ensemble an explicit (not decoupled) transaction
        # policy, so /config and ModelConfig print it.
        completed.model_transaction_policy.SetInParent()
    elif completed.platform == ENSEMBLE_PLATFORM:
        raise _error(source, "ensemble_scheduling",
                     "must be set for a model whose platform is 'ensemble'")
    else:
        optimization = completed.optimization
        if not optimization.HasField("input_pinned_memory"):
            optimization.input_pinned_memory.enable = True
        if not optimization.HasField("output_pinned_memory"):
            optimization.output_pinned_memory.enable = True
        _normalize_instance_groups(completed, source, gpu_count)
    if completed.model_transaction_policy.decoupled and completed.response_cache.enable:
        raise _error(source, "response_cache.enable",
                     "the response cache does not support decoupled models")
    check_ios(completed, source)
    check_batch_ios(completed, source)
    check_warmup(completed, source)
    return completed


def _complete_identity(config: ModelConfig, model_name: str, source: str) -> None:
    if not config.name:
        config.name = model_name
    if config.name != model_name:
        raise _error(source, "name", f"'{config.name}' does not match the model directory "
                     f"'{model_name}'; the directory name must equal the model name")
    if not config.backend:
        config.backend = _BACKEND_OF_PLATFORM.get(config.platform, "")
    if not config.platform:
        config.platform = _PLATFORM_OF_BACKEND.get(config.backend, "")
    if not config.default_model_filename:
        key = config.platform if config.platform in _PLATFORM_MODEL_FILENAME else config.backend
        config.default_model_filename = (_PLATFORM_MODEL_FILENAME.get(key)
                                         or _DEFAULT_MODEL_FILENAME.get(key, ""))
    if config.platform == ENSEMBLE_PLATFORM:
        if config.backend:
            raise _error(source, "backend", "must be empty for an ensemble (platform 'ensemble')")
        return
    if not config.backend:
        raise _error(source, "backend", "must specify 'backend' (or a known 'platform')")
    implied = _BACKEND_OF_PLATFORM.get(config.platform, "")
    if config.backend in _BACKEND_OF_PLATFORM.values() and implied != config.backend:
        raise _error(source, "platform",
                     f"'{config.platform}' does not match backend '{config.backend}'")


def _check_preferred_sizes(sizes: Iterable[int], max_batch_size: int, field: str,
                           source: str) -> None:
    for index, size in enumerate(sizes):
        if size <= 0:
            raise _error(source, f"{field}[{index}]", f"must be positive, got {size}")
        if size > max_batch_size:
            raise _error(source, f"{field}[{index}]",
                         f"{size} exceeds max_batch_size {max_batch_size}")


def _normalize_dynamic_batching(config: ModelConfig, source: str) -> None:
    """With max_batch_size 0 the dynamic batcher still queues (priorities, queue policies,
    timeouts) but every batch holds one request, as in Triton; preferred sizes must then be
    empty."""
    if not config.HasField("dynamic_batching"):
        return
    batching = config.dynamic_batching
    if not batching.preferred_batch_size and config.max_batch_size > 0:
        batching.preferred_batch_size.append(config.max_batch_size)
    _check_preferred_sizes(batching.preferred_batch_size, config.max_batch_size,
                           "dynamic_batching.preferred_batch_size", source)
    levels = batching.priority_levels
    if levels:
        if not 1 <= batching.default_priority_level <= levels:
            raise _error(source, "dynamic_batching.default_priority_level",
                         f"must be in range [1, {levels}], got {batching.default_priority_level}")
        for level in sorted(batching.priority_queue_policy):
            if not 1 <= level <= levels:
                raise _error(source, f"dynamic_batching.priority_queue_policy[{level}]",
                             f"priority level must be in range [1, {levels}]")
    if batching.preserve_ordering:
        if levels > 1:
            raise _error(source, "dynamic_batching.priority_levels",
                         "only one priority level is allowed when 'preserve_ordering' is true")
        policies = [("default_queue_policy", batching.default_queue_policy)]
        policies += [(f"priority_queue_policy[{level}]", policy)
                     for level, policy in sorted(batching.priority_queue_policy.items())]
        for name, policy in policies:
            if (policy.default_timeout_microseconds != 0
                    and policy.timeout_action == pb.ModelQueuePolicy.DELAY):
                raise _error(source, f"dynamic_batching.{name}.timeout_action",
                             "DELAY is not allowed when 'preserve_ordering' is true")


def _normalize_sequence_batching(config: ModelConfig, source: str) -> None:
    if not config.HasField("sequence_batching"):
        return
    sequence = config.sequence_batching
    if sequence.max_sequence_idle_microseconds == 0:
        sequence.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_MICROSECONDS
    if config.response_cache.enable:
        raise _error(source, "response_cache.enable",
                     "the response cache does not support sequence batching")
    check_sequence_controls(sequence, source)
    if sequence.HasField("oldest"):
        oldest = sequence.oldest
        if not oldest.preferred_batch_size and config.max_batch_size > 0:
            oldest.preferred_batch_size.append(config.max_batch_size)
        _check_preferred_sizes(oldest.preferred_batch_size, config.max_batch_size,
                               "sequence_batching.oldest.preferred_batch_size", source)
    if sequence.HasField("direct"):
        utilization = sequence.direct.minimum_slot_utilization
        if not 0.0 <= utilization <= 1.0:
            raise _error(source, "sequence_batching.direct.minimum_slot_utilization",
                         f"must be in range [0.0, 1.0], got {utilization}")


def _normalize_instance_groups(config: ModelConfig, source: str, gpu_count: int) -> None:
    group_type = pb.ModelInstanceGroup
    if not config.instance_group:
        config.instance_group.add(name=config.name)
    total = 0
    for i, group in enumerate(config.instance_group):
        field = f"instance_group[{i}]"
        if not group.name:
            group.name = f"{config.name}_{i}"
        if group.kind == group_type.KIND_AUTO:
            usable = gpu_count > 0 and all(0 <= gpu < gpu_count for gpu in group.gpus)
            group.kind = group_type.KIND_GPU if usable else group_type.KIND_CPU
        if group.count < 1:
            cpu = group.kind == group_type.KIND_CPU
            group.count = 2 if cpu and config.backend in _TWO_CPU_INSTANCE_BACKENDS else 1
        if group.kind == group_type.KIND_GPU:
            if gpu_count == 0:
                raise _error(source, f"{field}.kind", "KIND_GPU but no GPUs are available")
            if not group.gpus:
                group.gpus.extend(range(gpu_count))
            for gpu in group.gpus:
                if not 0 <= gpu < gpu_count:
                    raise _error(source, f"{field}.gpus", f"GPU id {gpu} is not available "
                                 f"(available: 0..{gpu_count - 1})")
        elif group.kind in (group_type.KIND_CPU, group_type.KIND_MODEL):
            if group.gpus:
                kind = group_type.Kind.Name(group.kind)
                raise _error(source, f"{field}.gpus", f"must be empty for {kind}")
        else:
            raise _error(source, f"{field}.kind", f"unknown kind {group.kind}")
        if group.profile and config.platform != TENSORRT_PLATFORM:
            raise _error(source, f"{field}.profile", "is only supported for TensorRT models")
        total += group.count * (len(group.gpus) if group.kind == group_type.KIND_GPU else 1)
        if total > MAX_MODEL_INSTANCES:
            raise _error(source, f"{field}.count", f"the model would have {total} instances; "
                         f"at most {MAX_MODEL_INSTANCES} are allowed (each is a process)")
