"""Load-time validation of an ensemble against its composing models, producing the
``EnsemblePlan`` that every request of the ensemble runs by (``run.EnsembleRun``).

Checks, in Triton's order (core ``ValidateEnsembleSchedulingConfig``, the dependency graph's
``CheckNode`` and ``ValidateEnsembleConfig``/``ValidateTensorMapping``), with Triton's messages:
the data flow of the config alone (``graph.build_graph``), circular dependencies between
ensembles, composing models that are unknown or whose required version is not loaded, the
ensemble's max_batch_size against each batching composing model's, every step input/output
mapped to a real input/output of its model, every required model input mapped, and the data
type and shape of each ensemble tensor the same wherever it is used. Shapes compare with -1 as
a wildcard, and a second time with the batch dimension made explicit, so a tensor may pass
between a batching and a non-batching model when the full shapes agree.

Errors are INVALID_ARG, except a decoupled composing model: UNSUPPORTED (``EnsembleRun``
handles one response per step).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as pb
from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.broker.ensemble.dependencies import check_circular_dependency
from shoal.broker.ensemble.graph import build_graph, step_label
from shoal.broker.ensemble.shapes import dims_match, format_dims, full_dims
from shoal.dtypes import config_to_wire
from shoal.errors import invalid_arg, unsupported

ENSEMBLE_PLATFORM = "ensemble"
LATEST_VERSION = -1


@dataclass(frozen=True, slots=True)
class StepInput:
    """One input of a composing model as a step feeds it from ensemble tensor ``tensor``.
    ``dims`` are the composing config's dims (no batch dim, -1 = any)."""

    tensor: str
    datatype: str  # wire name, e.g. "FP32"
    dims: tuple[int, ...]
    optional: bool


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """One ``ensemble_scheduling.step``. ``index`` is its position in the config (the number
    errors use); ``model_version`` -1 means the composing model's latest ready version."""

    index: int
    model_name: str
    model_version: int
    max_batch_size: int  # the composing model's
    inputs: Mapping[str, StepInput]  # composing input name -> what feeds it
    output_map: Mapping[str, str]  # composing output name -> ensemble tensor

    @property
    def input_map(self) -> dict[str, str]:
        return {name: spec.tensor for name, spec in self.inputs.items()}

    @property
    def label(self) -> str:
        return step_label(self.index, self.model_name)


@dataclass(frozen=True, slots=True)
class EnsembleTensor:
    """One ensemble tensor: written by step ``producer`` (None: an ensemble input), read by
    steps ``consumers`` (ascending indices). ``datatype``/``dims``/``batching`` are as first
    inferred (ensemble I/O first, then steps in config order)."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    batching: bool
    producer: int | None
    consumers: tuple[int, ...]
    is_input: bool
    is_output: bool


@dataclass(frozen=True)
class EnsemblePlan:
    """A validated ensemble. ``steps`` are in a topological order (each after the writers of
    all its inputs). ``output_dims``: each ensemble output's config shape (reshape if given),
    without batch dim. ``max_inflight_requests``: ``ensemble_scheduling.max_inflight_requests``
    (0: no limit; see ``admission.StepAdmission``). Read-only: shared by every request of the
    ensemble."""

    name: str
    max_batch_size: int
    steps: tuple[EnsembleStep, ...]
    tensors: Mapping[str, EnsembleTensor]
    inputs: tuple[str, ...]
    optional_inputs: frozenset[str]
    outputs: tuple[str, ...]
    output_dims: Mapping[str, tuple[int, ...]]
    max_inflight_requests: int = 0
    _by_index: dict[int, EnsembleStep] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_index", {step.index: step for step in self.steps})

    def step(self, index: int) -> EnsembleStep:
        return self._by_index[index]

    def composing_models(self) -> dict[str, set[int]]:
        """Composing model name -> the versions the steps ask for (-1: latest)."""
        models: dict[str, set[int]] = {}
        for step in self.steps:
            models.setdefault(step.model_name, set()).add(step.model_version)
        return models


@dataclass(frozen=True, slots=True)
class _Inferred:
    """What one model says about an ensemble tensor (Triton's TensorNode)."""

    model: str
    data_type: pb.DataType.ValueType  # config enum
    dims: tuple[int, ...]
    batching: bool


def validate_ensemble(config: ModelConfig, composing: Mapping[str, ModelConfig], *,
                      loaded_versions: Mapping[str, Collection[int]] | None = None,
                      ) -> EnsemblePlan:
    """Validate ensemble ``config`` (normalized) against ``composing``: model name -> the
    completed config of its loaded version (other models may be present too). With
    ``loaded_versions`` (model name -> loaded versions), a step's specific ``model_version``
    must be among them and every composing model must have one. Raises ShoalError."""
    name = config.name
    if not config.HasField("ensemble_scheduling") or config.platform != ENSEMBLE_PLATFORM:
        raise invalid_arg(f"model '{name}' is not an ensemble: an ensemble needs platform "
                          f"'{ENSEMBLE_PLATFORM}' and 'ensemble_scheduling'")
    graph = build_graph(config)
    steps = list(config.ensemble_scheduling.step)
    _check_dependencies(config, composing, loaded_versions)
    inferred = _ensemble_io(config)
    plan_steps: dict[int, EnsembleStep] = {}
    for index, step in enumerate(steps):
        model = composing[step.model_name]
        _check_composing_model(config, index, step, model)
        plan_steps[index] = _map_step(name, index, step, model, inferred)
    tensors = {
        tensor: EnsembleTensor(
            name=tensor, datatype=_wire(node.data_type), dims=node.dims, batching=node.batching,
            producer=graph.producers.get(tensor),
            consumers=tuple(graph.consumers.get(tensor, [])),
            is_input=any(io.name == tensor for io in config.input),
            is_output=any(io.name == tensor for io in config.output))
        for tensor, node in inferred.items()}
    return EnsemblePlan(
        name=name,
        max_batch_size=int(config.max_batch_size),
        steps=tuple(plan_steps[index] for index in graph.order),
        tensors=tensors,
        inputs=tuple(io.name for io in config.input),
        optional_inputs=frozenset(io.name for io in config.input if io.optional),
        outputs=tuple(io.name for io in config.output),
        output_dims={io.name: _config_dims(io) for io in config.output},
        max_inflight_requests=int(config.ensemble_scheduling.max_inflight_requests),
    )


def _check_dependencies(config: ModelConfig, composing: Mapping[str, ModelConfig],
                        loaded_versions: Mapping[str, Collection[int]] | None) -> None:
    name = config.name
    check_circular_dependency(name, {**composing, name: config})
    steps = list(config.ensemble_scheduling.step)
    missing = sorted({s.model_name for s in steps if s.model_name not in composing})
    if missing:
        raise invalid_arg(f"ensemble '{name}' contains models that are not available or "
                          f"ambiguous: {', '.join(missing)}")
    if loaded_versions is None:
        return
    for step in steps:
        loaded = loaded_versions.get(step.model_name, ())
        if not loaded:
            raise invalid_arg(f"ensemble '{name}' depends on '{step.model_name}' which has no "
                              "loaded version.")
        if step.model_version != LATEST_VERSION and step.model_version not in loaded:
            raise invalid_arg(f"ensemble '{name}' depends on '{step.model_name}' whose required "
                              f"version {step.model_version} is not loaded.")


def _check_composing_model(config: ModelConfig, index: int, step: pb.ModelEnsembling.Step,
                           model: ModelConfig) -> None:
    name = config.name
    if model.model_transaction_policy.decoupled:
        raise unsupported(f"in ensemble '{name}', {step_label(index, step.model_name)}: model "
                          f"'{step.model_name}' is decoupled; ensembles of decoupled models "
                          "are not supported")
    if 0 < model.max_batch_size < config.max_batch_size:
        raise invalid_arg(f"ensemble '{name}' allows maximum batch size "
                          f"{config.max_batch_size}, but it contains model '{step.model_name}' "
                          f"which only allows maximum batch size to be {model.max_batch_size}")


def _ensemble_io(config: ModelConfig) -> dict[str, _Inferred]:
    batching = config.max_batch_size > 0
    ios: list[pb.ModelInput | pb.ModelOutput] = [*config.input, *config.output]
    return {io.name: _Inferred(config.name, io.data_type, _config_dims(io), batching)
            for io in ios}


def _map_step(ensemble: str, index: int, step: pb.ModelEnsembling.Step, model: ModelConfig,
              inferred: dict[str, _Inferred]) -> EnsembleStep:
    """Triton's ValidateTensorMapping for one step; records what the step says about each
    tensor in ``inferred``."""
    model_name = step.model_name
    batching = model.max_batch_size > 0
    prefix = f"in ensemble '{ensemble}', "
    inputs_by_name = {io.name: io for io in model.input}
    for model_input, mapped in sorted(step.input_map.items()):
        if model_input not in inputs_by_name:
            raise invalid_arg(f"{prefix}ensemble tensor '{mapped}' is mapping to non-existing "
                              f"input '{model_input}' in model '{model_name}'")
    inputs: dict[str, StepInput] = {}
    for io in model.input:
        tensor = step.input_map.get(io.name)
        if tensor is None:
            if io.optional:
                continue
            raise invalid_arg(f"{prefix}input '{io.name}' in model '{model_name}' is not mapped "
                              "to any ensemble tensors")
        _infer(inferred, tensor, _Inferred(model_name, io.data_type, tuple(io.dims), batching),
               prefix)
        inputs[io.name] = StepInput(tensor, _wire(io.data_type), tuple(io.dims),
                                    bool(io.optional))
    outputs_by_name = {io.name: io for io in model.output}
    for model_output, tensor in sorted(step.output_map.items()):
        out = outputs_by_name.get(model_output)
        if out is None:
            raise invalid_arg(f"{prefix}ensemble tensor '{tensor}' is mapped from non-existing "
                              f"output '{model_output}' in model '{model_name}'")
        _infer(inferred, tensor, _Inferred(model_name, out.data_type, tuple(out.dims), batching),
               prefix)
    return EnsembleStep(
        index=index, model_name=model_name, model_version=int(step.model_version),
        max_batch_size=int(model.max_batch_size), inputs=inputs,
        output_map=dict(sorted(step.output_map.items())))


def _infer(inferred: dict[str, _Inferred], tensor: str, node: _Inferred, prefix: str) -> None:
    known = inferred.setdefault(tensor, node)
    if known is not node:
        _check_consistent(known, node, f"{prefix}ensemble tensor '{tensor}': ")


def _check_consistent(known: _Inferred, new: _Inferred, prefix: str) -> None:
    """Triton's ValidateTensorConsistency."""
    if known.data_type != new.data_type:
        raise invalid_arg(
            f"{prefix}inconsistent data type: {pb.DataType.Name(known.data_type)} is inferred "
            f"from model '{known.model}' while {pb.DataType.Name(new.data_type)} is inferred "
            f"from model '{new.model}'")
    known_full = full_dims(known.dims, known.batching)
    new_full = full_dims(new.dims, new.batching)
    if not dims_match(known.dims, new.dims) and not dims_match(known_full, new_full):
        raise invalid_arg(
            f"{prefix}inconsistent shape: {format_dims(known_full)} is inferred from model "
            f"'{known.model}' while {format_dims(new_full)} is inferred from model "
            f"'{new.model}'")


def _config_dims(io: pb.ModelInput | pb.ModelOutput) -> tuple[int, ...]:
    dims: Iterable[int] = io.reshape.shape if io.HasField("reshape") else io.dims
    return tuple(int(d) for d in dims)


def _wire(data_type: pb.DataType.ValueType) -> str:
    return config_to_wire(pb.DataType.Name(data_type))
