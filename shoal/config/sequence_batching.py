"""``ModelConfig.sequence_batching`` as typed, validated values, with Triton's messages (core
``ValidateModelConfig``, ``GetBooleanSequenceControlProperties``,
``GetTypedSequenceControlProperties``, ``SequenceBatchScheduler::GenerateInitialStateData``).

Data types are wire names ("FP32", "BYTES"), as everywhere else in shoal.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, Final, Literal

from shoal.dtypes import element_count, element_size
from shoal.errors import invalid_arg

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

SEQUENCE_IDLE_DEFAULT_US: Final = 1_000_000
INITIAL_STATE_FOLDER: Final = "initial_state"
WILDCARD_DIM: Final = -1

Strategy = Literal["direct", "oldest"]
ControlKind = Literal["START", "END", "READY", "CORRID"]

# inference.ModelSequenceBatching.Control.Kind numbering.
_KIND_BY_NUMBER: Final[dict[int, ControlKind]] = {0: "START", 1: "READY", 2: "END", 3: "CORRID"}
_VALUE_FIELDS: Final = (("int32_false_true", "INT32"), ("fp32_false_true", "FP32"),
                        ("bool_false_true", "BOOL"))
CORRID_DATA_TYPES: Final = ("UINT64", "INT64", "UINT32", "INT32", "BYTES")


def kind_name(kind: ControlKind) -> str:
    return f"CONTROL_SEQUENCE_{kind}"


@dataclass(frozen=True, slots=True)
class BoolControl:
    """A START, END or READY control input: ``data_type`` is INT32, FP32 or BOOL."""

    name: str
    data_type: str
    false_value: float | int | bool
    true_value: float | int | bool


@dataclass(frozen=True, slots=True)
class CorridControl:
    """The CORRID control input: ``data_type`` is one of ``CORRID_DATA_TYPES``."""

    name: str
    data_type: str


@dataclass(frozen=True, slots=True)
class ControlInputs:
    """The control tensors the model declared; None = the model does not take that control."""

    start: BoolControl | None = None
    end: BoolControl | None = None
    ready: BoolControl | None = None
    corrid: CorridControl | None = None


@dataclass(frozen=True, slots=True)
class InitialStateSpec:
    """What a sequence's state input holds before its first execution: zeros, or the bytes of
    ``<model dir>/initial_state/<data_file>`` (``relative_path``). ``shape`` includes the batch
    dim of 1 when the model batches. Whoever loads the file checks it holds at least ``nbytes``
    (Triton: "initial_state setting expects N bytes ..."); BYTES states (``nbytes`` None) take
    the file as is."""

    name: str
    data_type: str
    shape: tuple[int, ...]
    zero_data: bool
    data_file: str = ""

    @property
    def nbytes(self) -> int | None:
        if self.data_type == "BYTES":
            return None
        return element_count(self.shape) * element_size(self.data_type)

    @property
    def relative_path(self) -> str:
        return f"{INITIAL_STATE_FOLDER}/{self.data_file}" if self.data_file else ""


@dataclass(frozen=True, slots=True)
class StateSpec:
    """One ``sequence_batching.state`` entry (implicit state).

    ``initial`` None: the first input state has ``default_shape`` (variable dims as 1) and is
    zero-filled (empty strings for BYTES), as Triton's SequenceStates::Initialize.
    ``single_buffer``: input and output share one buffer (no swap after an execution)."""

    input_name: str
    output_name: str
    data_type: str
    dims: tuple[int, ...]
    default_shape: tuple[int, ...]
    initial: InitialStateSpec | None = None
    single_buffer: bool = False
    growable: bool = False


@dataclass(frozen=True)
class SequenceBatcherConfig:
    """``ModelConfig.sequence_batching`` plus ``max_batch_size`` and the model name (used in
    client-facing messages). ``max_queue_delay_us`` is the chosen strategy's value.

    direct: ``minimum_slot_utilization`` applies; oldest: ``max_candidate_sequences``,
    ``preferred_batch_sizes`` (empty = (max_batch_size,)) and ``preserve_ordering`` apply."""

    model_name: str
    max_batch_size: int
    strategy: Strategy = "direct"
    max_sequence_idle_us: int = SEQUENCE_IDLE_DEFAULT_US
    max_queue_delay_us: int = 0
    minimum_slot_utilization: float = 0.0
    max_candidate_sequences: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    preserve_ordering: bool = False
    controls: ControlInputs = ControlInputs()
    states: tuple[StateSpec, ...] = ()

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def batching(self) -> bool:
        """Tensors carry a leading batch dimension (max_batch_size > 0)."""
        return self.max_batch_size > 0

    @property
    def slots_per_instance(self) -> int:
        """Triton's seq_slot_cnt: max(1, max_batch_size), or max_candidate_sequences when the
        oldest strategy sets it."""
        if self.strategy == "oldest" and self.max_candidate_sequences > 0:
            return self.max_candidate_sequences
        return max(1, self.max_batch_size)

    @classmethod
    def from_model_config(cls, config: ModelConfig) -> SequenceBatcherConfig:
        """Read ``config.sequence_batching`` (raw or normalized). Raises ShoalError: INVALID_ARG
        with Triton's validation messages. An ``iterative_sequence`` model does not come here:
        its requests are sequences of their own (``broker/schedulers/iterative.py``)."""
        name = str(config.name)
        batcher = config.sequence_batching
        if config.max_batch_size < 0:
            raise invalid_arg(f"'max_batch_size' must be non-negative value for {name}")
        strategy: Strategy = "oldest" if batcher.HasField("oldest") else "direct"
        oldest, direct = batcher.oldest, batcher.direct
        return cls(
            model_name=name,
            max_batch_size=int(config.max_batch_size),
            strategy=strategy,
            max_sequence_idle_us=int(batcher.max_sequence_idle_microseconds)
            or SEQUENCE_IDLE_DEFAULT_US,
            max_queue_delay_us=int((oldest if strategy == "oldest" else direct)
                                   .max_queue_delay_microseconds),
            minimum_slot_utilization=float(direct.minimum_slot_utilization),
            max_candidate_sequences=int(oldest.max_candidate_sequences),
            preferred_batch_sizes=tuple(sorted({int(s) for s in oldest.preferred_batch_size})),
            preserve_ordering=bool(oldest.preserve_ordering),
            controls=_controls_from_proto(batcher, name),
            states=tuple(_states_from_proto(batcher, int(config.max_batch_size), name)),
        )


def _controls_from_proto(batcher: Any, model: str) -> ControlInputs:
    flags: dict[ControlKind, BoolControl] = {}
    corrid: CorridControl | None = None
    tensors: set[str] = set()
    for control_input in batcher.control_input:
        if not control_input.name:
            raise invalid_arg(f"sequence batching control tensor must have a name for {model}")
        if control_input.name in tensors or len(control_input.control) > 1:
            raise invalid_arg(f"sequence batching control tensor '{control_input.name}' is "
                              f"specified for multiple control kinds for {model}")
        tensors.add(control_input.name)
        for control in control_input.control:
            kind = _KIND_BY_NUMBER.get(int(control.kind))
            if kind is None:
                raise invalid_arg(f"unknown sequence batching control kind {control.kind} "
                                  f"for {model}")
            if kind in flags or (kind == "CORRID" and corrid is not None):
                raise invalid_arg(f"sequence batching specifies multiple {kind_name(kind)} "
                                  f"tensors for {model}")
            made = _control_from_proto(control_input.name, kind, control, model)
            if isinstance(made, CorridControl):
                corrid = made
            else:
                flags[kind] = made
    return ControlInputs(flags.get("START"), flags.get("END"), flags.get("READY"), corrid)


def _control_from_proto(
    tensor: str, kind: ControlKind, control: Any, model: str
) -> BoolControl | CorridControl:
    given = [(field, dtype) for field, dtype in _VALUE_FIELDS if len(getattr(control, field))]
    if kind == "CORRID":
        if given:
            raise invalid_arg("sequence batching must not specify either 'int32_false_true', "
                              f"'fp32_false_true' or 'bool_false_true' for {kind_name(kind)} "
                              f"for {model}")
        data_type = _wire_name(int(control.data_type))
        if data_type not in CORRID_DATA_TYPES:
            raise invalid_arg(f"unexpected data type for control {kind_name(kind)} for {model}. "
                              "Allowed data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, "
                              "TYPE_INT32 and TYPE_STRING")
        return CorridControl(tensor, data_type)
    if not given:
        raise invalid_arg("sequence batching must specify either 'int32_false_true', "
                          f"'fp32_false_true' or 'bool_false_true' for {kind_name(kind)} "
                          f"for {model}")
    if len(given) > 1:
        raise invalid_arg("sequence batching specifies more than one from 'int32_false_true', "
                          f"'fp32_false_true' and 'bool_false_true' for {kind_name(kind)} "
                          f"for {model}")
    field, data_type = given[0]
    values = list(getattr(control, field))
    if len(values) != 2:
        raise invalid_arg(f"sequence batching control '{field}' must have exactly 2 entries "
                          f"for {kind_name(kind)} for {model}")
    return BoolControl(tensor, data_type, values[0], values[1])


def _wire_name(data_type: int) -> str:
    from tritonclient.grpc import model_config_pb2 as pb

    # ValueType: int at run time, the enum's NewType in the stub (typings/)
    name = str(pb.DataType.Name(pb.DataType.ValueType(data_type)))
    return "BYTES" if name == "TYPE_STRING" else name.removeprefix("TYPE_")


def _states_from_proto(batcher: Any, max_batch_size: int, model: str) -> list[StateSpec]:
    specs: list[StateSpec] = []
    seen: set[tuple[str, str]] = set()
    for state in batcher.state:
        dims = tuple(int(d) for d in state.dims)
        batch_dim = (1,) if max_batch_size > 0 else ()
        for kind, tensor in (("input", state.input_name), ("output", state.output_name)):
            if (kind, tensor) in seen:
                raise invalid_arg(f"State {kind} name '{tensor}' specified more than once.")
            seen.add((kind, tensor))
        if state.use_growable_memory and not state.use_same_buffer_for_input_output:
            raise invalid_arg("In order to 'use_growable_memory', you must also enable "
                              f"'use_single_buffer' for state input name '{state.input_name}'.")
        initial = _initial_state(state, dims, batch_dim)
        specs.append(StateSpec(
            input_name=str(state.input_name),
            output_name=str(state.output_name),
            data_type=_wire_name(int(state.data_type)),
            dims=dims,
            default_shape=batch_dim + tuple(1 if d == WILDCARD_DIM else d for d in dims),
            initial=initial,
            single_buffer=bool(state.use_same_buffer_for_input_output),
            growable=bool(state.use_growable_memory),
        ))
    return specs


def _initial_state(
    state: Any, dims: tuple[int, ...], batch_dim: tuple[int, ...]
) -> InitialStateSpec | None:
    """GenerateInitialStateData's checks, without reading the file."""
    name = state.input_name
    if len(state.initial_state) > 1:
        raise invalid_arg(f"initial_state field for state input '{name}' must contain exactly "
                          f"one or zero element. Found '{len(state.initial_state)}' elements.")
    if not state.initial_state:
        return None
    initial = state.initial_state[0]
    if initial.data_type != state.data_type:
        raise invalid_arg(f"The data type used for 'initial_state' field of state '{name}' does "
                          "not match the state data type.")
    if not initial.name:
        raise invalid_arg("Field 'name' must be set when using initial_state for state input "
                          f"'{name}'.")
    initial_dims = tuple(int(d) for d in initial.dims)
    if len(initial_dims) != len(dims):
        raise invalid_arg("Number of dimensions in 'initial_state' doesn't match the size of "
                          f"'state' dimensions for state input '{name}'. "
                          f"{len(initial_dims)} != {len(dims)}")
    for initial_dim, state_dim in zip(initial_dims, dims, strict=True):
        if initial_dim == WILDCARD_DIM:
            raise invalid_arg(f"'initial_state' field for state input name '{name}' contains "
                              "variable dimensions.")
        if state_dim != WILDCARD_DIM and initial_dim != state_dim:
            raise invalid_arg(f"'initial_state' dim for input name '{name}' doesn't match "
                              f"'state' dim description. {initial_dim} != {state_dim}")
    which = initial.WhichOneof("state_data")
    if which is None:
        raise invalid_arg(f"initial_state setting expects state'{name}' to have state_data set")
    data_file = str(initial.data_file) if which == "data_file" else ""
    if which == "data_file":
        _check_data_file(data_file, name)
    return InitialStateSpec(
        name=str(initial.name),
        data_type=_wire_name(int(initial.data_type)),
        shape=batch_dim + initial_dims,
        zero_data=which == "zero_data",
        data_file=data_file,
    )


def _check_data_file(data_file: str, state_name: str) -> None:
    """Not in Triton: a config must not name a file outside the model's initial_state/."""
    path = PurePosixPath(data_file)
    if not data_file or path.is_absolute() or ".." in path.parts or "\\" in data_file:
        raise invalid_arg(f"initial_state data_file for state input '{state_name}' must be a "
                          f"relative path inside '{INITIAL_STATE_FOLDER}/'")


def _validate(config: SequenceBatcherConfig) -> None:
    """Checks on the typed values (so configs built in code are checked too)."""
    name = config.model_name
    if config.max_batch_size < 0:
        raise invalid_arg(f"'max_batch_size' must be non-negative value for {name}")
    if config.strategy not in ("direct", "oldest"):
        raise invalid_arg(f"unknown sequence batching strategy '{config.strategy}' for {name}")
    if config.max_sequence_idle_us <= 0:
        raise invalid_arg(f"sequence batching max_sequence_idle_microseconds must be positive "
                          f"for {name}")
    if config.max_queue_delay_us < 0 or config.max_candidate_sequences < 0:
        raise invalid_arg(f"sequence batching values must be non-negative for {name}")
    for size in config.preferred_batch_sizes:
        if size <= 0:
            raise invalid_arg(f"sequence batching preferred batch size must be positive for {name}")
        if size > config.max_batch_size:
            raise invalid_arg("sequence batching preferred batch size must be <= max batch size "
                              f"for {name}")
    if not 0.0 <= config.minimum_slot_utilization <= 1.0:
        raise invalid_arg("sequence batching minimum slot utilization must be in range "
                          f"(0.0, 1.0] for {name}")
    corrid = config.controls.corrid
    if corrid is not None and corrid.data_type not in CORRID_DATA_TYPES:
        raise invalid_arg(f"unexpected data type for control {kind_name('CORRID')} for {name}")

