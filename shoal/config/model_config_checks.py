"""Structural checks of a model configuration (Triton core ValidateModelIOConfig, the sequence
control checks of ValidateModelConfig, ValidateEnsembleSchedulingConfig; and ``model_warmup``).
Private helper of ``shoal.config.model_config``: pure functions over ``ModelConfig``; each raises
INVALID_ARG with the message ``"<source>: <field path>: <problem>"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any, Final

from tritonclient.grpc import model_config_pb2 as pb
from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.errors import ShoalError, invalid_arg

ENSEMBLE_PLATFORM: Final = "ensemble"
TENSORRT_PLATFORM: Final = "tensorrt_plan"
WILDCARD_DIM: Final = -1

_CORRID_TYPES: Final = frozenset(
    {pb.TYPE_UINT64, pb.TYPE_INT64, pb.TYPE_UINT32, pb.TYPE_INT32, pb.TYPE_STRING})
_CONTROL_VALUE_FIELDS: Final = ("int32_false_true", "fp32_false_true", "bool_false_true")


def config_error(source: str, field: str, problem: str) -> ShoalError:
    return invalid_arg(f"{source}: {field}: {problem}")


_error = config_error


def check_enum_values(message: Any, source: str, path: str = "") -> None:
    """Every enum value set anywhere in ``message`` names a value of its enum. The enums of
    model_config.proto are open (proto3): ``kind: 77`` parses, and looking its name up later
    raises ValueError; Triton's parser refuses such numbers."""
    for field, value in message.ListFields():
        name = f"{path}{field.name}"
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            value_field = entry.fields_by_name["value"]
            for key in value:
                if value_field.message_type is not None:
                    check_enum_values(value[key], source, f"{name}[{key!r}].")
                elif value_field.enum_type is not None:
                    _check_enum_value(value_field, value[key], f"{name}[{key!r}]", source)
        elif entry is not None:
            items = list(value) if field.is_repeated else [value]
            for index, item in enumerate(items):
                where = f"{name}[{index}]." if field.is_repeated else f"{name}."
                check_enum_values(item, source, where)
        elif field.enum_type is not None:
            for index, item in enumerate(value if field.is_repeated else [value]):
                _check_enum_value(field, item, f"{name}[{index}]" if field.is_repeated else name,
                                  source)


def _check_enum_value(field: Any, value: int, where: str, source: str) -> None:
    if value not in field.enum_type.values_by_number:
        raise _error(source, where, f"{value} is not a value of {field.enum_type.name}")


def check_sequence_controls(sequence: Any, source: str) -> None:
    kind_type = pb.ModelSequenceBatching.Control.Kind
    tensors: set[str] = set()
    kinds: set[int] = set()
    for i, control_input in enumerate(sequence.control_input):
        field = f"sequence_batching.control_input[{i}]"
        if not control_input.name:
            raise _error(source, f"{field}.name", "must specify 'name'")
        if control_input.name in tensors:
            raise _error(source, f"{field}.name",
                         f"tensor '{control_input.name}' is used for more than one control")
        tensors.add(control_input.name)
        for j, control in enumerate(control_input.control):
            kind = kind_type.Name(control.kind)
            control_field = f"{field}.control[{j}]"
            if control.kind in kinds:
                raise _error(source, f"{control_field}.kind", f"{kind} is specified twice")
            kinds.add(control.kind)
            given = [name for name in _CONTROL_VALUE_FIELDS if len(getattr(control, name))]
            if control.kind == pb.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID:
                if given:
                    raise _error(source, f"{control_field}.{given[0]}", f"not allowed for {kind}")
                if control.data_type not in _CORRID_TYPES:
                    raise _error(source, f"{control_field}.data_type",
                                 f"{kind} must be TYPE_UINT64, TYPE_INT64, TYPE_UINT32, "
                                 "TYPE_INT32 or TYPE_STRING")
                continue
            if len(given) != 1:
                raise _error(source, control_field, f"{kind} must specify exactly one of "
                             "'int32_false_true', 'fp32_false_true' or 'bool_false_true'")
            if len(getattr(control, given[0])) != 2:
                raise _error(source, f"{control_field}.{given[0]}",
                             "must have exactly 2 entries (false value, true value)")


def check_ensemble(config: ModelConfig, source: str) -> None:
    if config.platform != ENSEMBLE_PLATFORM:
        raise _error(source, "ensemble_scheduling", "requires platform 'ensemble'")
    for field in ("instance_group", "model_warmup"):
        if len(getattr(config, field)):
            raise _error(source, field, "must not be specified for an ensemble")
    if config.HasField("optimization"):
        raise _error(source, "optimization", "must not be specified for an ensemble")
    steps = config.ensemble_scheduling.step
    if not steps:
        raise _error(source, "ensemble_scheduling.step", "must not be empty")
    produced: set[str] = set()
    for i, step in enumerate(steps):
        for name in ("model_name", "input_map", "output_map"):
            if not getattr(step, name):
                raise _error(source, f"ensemble_scheduling.step[{i}].{name}", "must not be empty")
        for tensor in step.output_map.values():
            if tensor in produced:
                raise _error(source, f"ensemble_scheduling.step[{i}].output_map",
                             f"ensemble tensor '{tensor}' is written by more than one step")
            produced.add(tensor)
    available = {io.name for io in config.input}
    pending = list(steps)
    while ready := [s for s in pending if all(t in available for t in s.input_map.values())]:
        for step in ready:
            available.update(step.output_map.values())
            pending.remove(step)
    consumed = {t for step in steps for t in step.input_map.values()}
    outputs = {io.name for io in config.output}
    for i, io in enumerate(config.input):
        if io.name not in consumed:
            raise _error(source, f"input[{i}]", f"ensemble input '{io.name}' is not used")
    for i, out in enumerate(config.output):
        if out.name not in available:
            raise _error(source, f"output[{i}]", f"ensemble output '{out.name}' is not written "
                         "(no step produces it from available tensors)")
    unused = sorted(produced - consumed - outputs)
    if unused:
        raise _error(source, "ensemble_scheduling.step", f"ensemble tensor '{unused[0]}' is unused")


def _element_count(dims: Sequence[int]) -> int:
    """Triton's GetElementCount: -1 when any dim is variable, 0 for an empty shape."""
    if not dims:
        return 0
    count = 1
    for dim in dims:
        if dim == WILDCARD_DIM:
            return WILDCARD_DIM
        count *= dim
    return count


def _fixed_chunks(dims: Sequence[int]) -> list[int]:
    """Element counts of the runs of fixed dims between variable dims."""
    chunks, count = [], 1
    for dim in dims:
        if dim == WILDCARD_DIM:
            chunks.append(count)
            count = 1
        else:
            count *= dim
    return [*chunks, count]


def _check_dims(dims: Sequence[int], field: str, source: str) -> None:
    for index, dim in enumerate(dims):
        if dim < 1 and dim != WILDCARD_DIM:
            raise _error(source, f"{field}[{index}]", f"{dim} is not allowed: a dimension must "
                         "be an integer >= 1, or -1 for a variable-size dimension")


def _validate_io_shape(io: Any, max_batch_size: int, field: str, source: str) -> None:
    if not io.name:
        raise _error(source, f"{field}.name", "must specify 'name'")
    if io.data_type == pb.TYPE_INVALID or io.data_type not in pb.DataType.values():
        raise _error(source, f"{field}.data_type", f"'{io.name}' must specify a valid 'data_type'")
    if not io.dims:
        raise _error(source, f"{field}.dims", f"must not be empty ('{io.name}'; for a "
                           "tensor that is only the batch dimension use dims: [ 1 ] with "
                           "reshape: { shape: [ ] })")
    _check_dims(io.dims, f"{field}.dims", source)
    if not io.HasField("reshape"):
        return
    shape = list(io.reshape.shape)
    if not shape and max_batch_size == 0:
        raise _error(source, f"{field}.reshape", "cannot be empty for a non-batching model "
                     "(scalar tensors are not supported)")
    _check_dims(shape, f"{field}.reshape.shape", source)
    dims_count, reshape_count = _element_count(io.dims), _element_count(shape)
    if dims_count != reshape_count and (reshape_count != 0 or dims_count != 1):
        raise _error(source, f"{field}.reshape", f"'{io.name}' has a different size for dims "
                     "and reshape")
    if dims_count == WILDCARD_DIM and _fixed_chunks(io.dims) != _fixed_chunks(shape):
        raise _error(source, f"{field}.reshape", f"'{io.name}' dims and reshape differ in "
                     "their variable-size dimensions or in the sizes between them")


def check_ios(config: ModelConfig, source: str) -> None:
    format_type = pb.ModelInput
    sections: tuple[tuple[str, Sequence[pb.ModelInput | pb.ModelOutput]], ...] = (
        ("input", config.input), ("output", config.output))
    for kind, ios in sections:
        names: set[str] = set()
        for i, io in enumerate(ios):
            field = f"{kind}[{i}]"
            _validate_io_shape(io, config.max_batch_size, field, source)
            if io.name in names:
                raise _error(source, f"{field}.name", f"duplicate {kind} name '{io.name}'")
            names.add(io.name)
            # an input (kind "input"): only ModelInput has ``format``
            if (isinstance(io, format_type)
                    and io.format in (format_type.FORMAT_NHWC, format_type.FORMAT_NCHW)
                    and len(io.dims) != 3):
                raise _error(source, f"{field}.format", "NHWC/NCHW require 3 dims")
            if io.is_shape_tensor and config.platform != TENSORRT_PLATFORM:
                raise _error(source, f"{field}.is_shape_tensor",
                             "shape tensors are only supported for TensorRT models")
            if io.is_non_linear_format_io and (config.platform != TENSORRT_PLATFORM
                                               or len(io.dims) != 3):
                raise _error(source, f"{field}.is_non_linear_format_io",
                             "only supported for TensorRT models, with 3 dims")


def check_batch_ios(config: ModelConfig, source: str) -> None:
    inputs = {io.name for io in config.input}
    outputs = {io.name for io in config.output}
    for i, batch_input in enumerate(config.batch_input):
        field = f"batch_input[{i}]"
        if len(batch_input.source_input) != 1:
            raise _error(source, f"{field}.source_input",
                         f"expects 1 source input, got {len(batch_input.source_input)}")
        if batch_input.data_type not in (pb.TYPE_INT32, pb.TYPE_FP32):
            raise _error(source, f"{field}.data_type", "must be TYPE_INT32 or TYPE_FP32")
        for name in batch_input.source_input:
            if name not in inputs:
                raise _error(source, f"{field}.source_input", f"unknown input '{name}'")
    for i, batch_output in enumerate(config.batch_output):
        field = f"batch_output[{i}]"
        if len(batch_output.source_input) != 1:
            raise _error(source, f"{field}.source_input",
                         f"expects 1 source input, got {len(batch_output.source_input)}")
        for name in batch_output.source_input:
            if name not in inputs:
                raise _error(source, f"{field}.source_input", f"unknown input '{name}'")
        targets = list(batch_output.target_name)
        for name in targets:
            if name not in outputs:
                raise _error(source, f"{field}.target_name", f"unknown output '{name}'")
        if len(set(targets)) != len(targets):
            raise _error(source, f"{field}.target_name", "an output may be named only once")


WARMUP_FOLDER: Final = "warmup"
_WARMUP_DATA_FIELDS: Final = "'zero_data', 'random_data' or 'input_data_file'"


def warmup_file_problem(file_name: str) -> str | None:
    """Why ``file_name`` (a ``model_warmup`` input_data_file) cannot name a file inside the
    model's ``warmup/`` folder, judged from the name alone; None when it can. Symlinks are the
    reader's to check (shoal.workers.warmup)."""
    path = PurePosixPath(file_name)
    if (not file_name or path.is_absolute() or ".." in path.parts or "\\" in file_name
            or "\0" in file_name or path == PurePosixPath(".")):
        return (f"input_data_file '{file_name}' must be a relative path to a file inside the "
                f"model's '{WARMUP_FOLDER}/' folder")
    return None


def _warmup_input_names(config: ModelConfig) -> dict[str, Any]:
    """Names a warmup sample may give: the model inputs (name -> ModelInput), and the sequence
    control and state input tensors (name -> None: no declared data_type to match)."""
    names: dict[str, Any] = {io.name: io for io in config.input}
    sequence = config.sequence_batching
    names.update({control.name: None for control in sequence.control_input})
    names.update({state.input_name: None for state in sequence.state})
    return names


def _dims_fit(dims: Sequence[int], declared: Sequence[int]) -> bool:
    return len(dims) == len(declared) and all(
        want in (WILDCARD_DIM, dim) for dim, want in zip(dims, declared, strict=True))


def _check_warmup_input(spec: Any, model_input: Any, field: str, source: str) -> None:
    if spec.data_type == pb.TYPE_INVALID or spec.data_type not in pb.DataType.values():
        raise _error(source, f"{field}.data_type", "must specify a valid 'data_type'")
    if model_input is not None and spec.data_type != model_input.data_type:
        raise _error(source, f"{field}.data_type", f"{pb.DataType.Name(spec.data_type)} does not "
                     f"match the input's {pb.DataType.Name(model_input.data_type)}")
    for index, dim in enumerate(spec.dims):
        if dim < 0:
            raise _error(source, f"{field}.dims[{index}]", f"{dim} is not allowed: warmup "
                         "expects every variable-size dimension to be specified")
    if model_input is not None and not _dims_fit(spec.dims, model_input.dims):
        raise _error(source, f"{field}.dims", f"{list(spec.dims)} does not match the input's "
                     f"dims {list(model_input.dims)}")
    choice = spec.WhichOneof("input_data_type")
    if choice is None:
        raise _error(source, field, f"must specify one of {_WARMUP_DATA_FIELDS}")
    if choice == "input_data_file":
        problem = warmup_file_problem(spec.input_data_file)
        if problem is not None:
            raise _error(source, f"{field}.input_data_file", problem)


def check_warmup(config: ModelConfig, source: str) -> None:
    """``model_warmup`` of a non-ensemble model. Triton finds most of these faults only when an
    instance generates its warmup data (or when the backend runs it); shoal refuses them with
    the config. Unlike Triton, which skips a sample of batch_size 0, that is an error."""
    known = _warmup_input_names(config)
    required = [io.name for io in config.input if not io.optional]
    for i, sample in enumerate(config.model_warmup):
        field = f"model_warmup[{i}]"
        if sample.batch_size < 1:
            raise _error(source, f"{field}.batch_size", "must be >= 1")
        if 0 < config.max_batch_size < sample.batch_size:
            raise _error(source, f"{field}.batch_size", f"{sample.batch_size} exceeds "
                         f"max_batch_size {config.max_batch_size}")
        for name in sorted(sample.inputs):
            if name not in known:
                raise _error(source, f"{field}.inputs[{name!r}]", f"unknown input '{name}'")
            _check_warmup_input(sample.inputs[name], known[name], f"{field}.inputs[{name!r}]",
                                source)
        missing = [name for name in required if name not in sample.inputs]
        if missing:
            raise _error(source, f"{field}.inputs", f"missing input '{missing[0]}' (every input "
                         "that is not optional must be given)")
