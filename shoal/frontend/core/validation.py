"""Checking a decoded infer request against the model's metadata, before anything is queued
(pure). The checks and their order follow Triton's core (``InferenceRequest::Normalize``):
requested outputs, input count and names, batch size, then per input datatype, shape and byte
size. Every message names the field at fault and the model. The messages Triton's core writes
for a request start as there with the request's id, ``[request id: <id>] `` (``<id_unknown>``
when the request has none); those Triton writes elsewhere (an unknown input or output, a
classification of an unsupported type, a string element longer than the data) do not.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from shoal import dtypes
from shoal.errors import ErrorCode, ShoalError, invalid_arg
from shoal.frontend.core.decoded import DecodedInput, DecodedRequest, format_dims, request_tag
from shoal.frontend.core.shm_params import SharedMemorySlice
from shoal.messages import ModelVersionInfo, Params, TensorSpec

CLASSIFIABLE: Final = frozenset({
    "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64",
})
_BATCH_NOTE: Final = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension "
    "to be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)
_LENGTH = struct.Struct("<I")


class RequestCheckError(ShoalError):
    """INVALID_ARG from a check Triton's core makes on a request: ``validate_request`` gives
    its message the request's id, as Triton's core does (module doc)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_ARG, message)


def tagged(error: RequestCheckError, client_id: str) -> ShoalError:
    """``error`` as Triton's core says it of the request ``client_id``: INVALID_ARG with the
    request's id first (``request_tag``)."""
    return invalid_arg(request_tag(client_id) + error.message)


@dataclass(frozen=True, slots=True)
class OutputPlan:
    """How one output is returned: binary or JSON, or as top-N classification (BYTES), or
    written into a client's shared-memory region (``shm``; the response then has no data)."""

    name: str
    datatype: str
    binary: bool
    classification: int = 0
    parameters: Params = field(default_factory=dict)
    shm: SharedMemorySlice | None = None


@dataclass(frozen=True, slots=True)
class InferPlan:
    """The validated request: batch size (1 for non-batching models) and the outputs to return.
    ``explicit_outputs`` is False when the request named none (then every output returns, and
    ``outputs`` is shared by such requests of the model: read it, never change it)."""

    batch_size: int
    outputs: list[OutputPlan]
    explicit_outputs: bool
    binary_output_default: bool

    def output(self, name: str) -> OutputPlan | None:
        for plan in self.outputs:
            if plan.name == name:
                return plan
        return None


class _ModelFacts:
    """What validation looks up in a model's metadata, built once per ModelVersionInfo (the
    broker replaces the object when the model changes). ``default_outputs``: the checked plans
    of a request that names no output, per ``binary_output_default``; ``named_outputs``: the
    checked plan of an output named with no parameter but ``binary_data``, per (name, binary).
    Both are shared by the requests that match (plans are never mutated)."""

    __slots__ = ("all_required", "default_outputs", "input_names", "input_specs", "model",
                 "named_outputs", "output_specs")

    def __init__(self, model: ModelVersionInfo) -> None:
        self.model = model
        self.input_specs = {spec.name: spec for spec in model.inputs}
        self.output_specs = {spec.name: spec for spec in model.outputs}
        self.input_names = frozenset(self.input_specs)
        self.all_required = len(self.input_names) == len(model.inputs) and not any(
            spec.optional for spec in model.inputs)
        self.default_outputs: dict[bool, list[OutputPlan]] = {}
        self.named_outputs: dict[tuple[str, bool], OutputPlan] = {}


_FACTS: dict[int, _ModelFacts] = {}  # id(model) -> facts; the entry holds the model alive
_FACTS_LIMIT: Final = 256  # cleared when full (models are few; snapshots replace them)


def _facts(model: ModelVersionInfo) -> _ModelFacts:
    facts = _FACTS.get(id(model))
    if facts is None or facts.model is not model:
        if len(_FACTS) >= _FACTS_LIMIT:
            _FACTS.clear()
        facts = _FACTS[id(model)] = _ModelFacts(model)
    return facts


def validate_request(request: DecodedRequest, model: ModelVersionInfo) -> InferPlan:
    """Raises INVALID_ARG on the first problem found."""
    try:
        return _validate(request, model)
    except RequestCheckError as error:
        raise tagged(error, request.client_id) from None


def _validate(request: DecodedRequest, model: ModelVersionInfo) -> InferPlan:
    facts = _facts(model)
    outputs = _plan_outputs(request, model, facts)
    inputs = request.inputs
    # the usual request: every input of the model once, nothing else (else the full checks,
    # which name the problem)
    if not (facts.all_required and len(inputs) == len(facts.input_names)
            and {tensor.name for tensor in inputs} == facts.input_names):
        check_input_names(inputs, model)
    batch_size = batch_size_of(inputs, model)
    specs = facts.input_specs
    for tensor in inputs:
        spec = specs[tensor.name]
        check_datatype(tensor, spec, model.name)
        check_shape(tensor, spec, model)
        check_byte_size(tensor, model.name)
    if batch_size < 1:  # shoal's check, after Triton's (whose shape error comes first)
        raise RequestCheckError(f"inference request batch-size must be >= 1 for "
                                f"'{model.name}'")
    return InferPlan(batch_size, outputs, bool(request.outputs), request.binary_output_default)


def plan_outputs(request: DecodedRequest, model: ModelVersionInfo) -> list[OutputPlan]:
    return _plan_outputs(request, model, _facts(model))


def _plan_outputs(request: DecodedRequest, model: ModelVersionInfo,
                  facts: _ModelFacts) -> list[OutputPlan]:
    specs = facts.output_specs
    default = request.binary_output_default
    if not request.outputs:
        plans = facts.default_outputs.get(default)
        if plans is None:  # not kept when a check refuses: it refuses every time
            plans = [_checked_output(OutputPlan(s.name, s.datatype, default))
                     for s in model.outputs]
            facts.default_outputs[default] = plans
        return plans
    plans = []
    seen: set[str] = set()
    for wanted in request.outputs:
        if wanted.name in seen:
            # Triton 2.51 took the first and ignored the rest; Triton since core #493 (2026)
            # refuses with this text, as shoal always did
            raise RequestCheckError(f"output '{wanted.name}' already exists in request")
        seen.add(wanted.name)
        spec = specs.get(wanted.name)
        if spec is None:
            raise invalid_arg(
                f"unexpected inference output '{wanted.name}' for model '{model.name}'"
            )
        binary = default if wanted.binary is None else wanted.binary
        if wanted.parameters or wanted.shm is not None or wanted.classification:
            plan = _checked_output(OutputPlan(spec.name, spec.datatype, binary,
                                              wanted.classification, dict(wanted.parameters),
                                              wanted.shm))
        else:  # a plain named output: one plan per (name, binary), kept once it passed
            named = facts.named_outputs.get((spec.name, binary))
            if named is None:
                named = _checked_output(OutputPlan(spec.name, spec.datatype, binary))
                facts.named_outputs[spec.name, binary] = named
            plan = named
        plans.append(plan)
    return plans


def _checked_output(plan: OutputPlan) -> OutputPlan:
    """Refuse now what could only fail after execution."""
    if plan.shm is not None:
        return plan  # bytes go to the client's region: any datatype, no JSON encoding
    if plan.classification > 0 and plan.datatype not in CLASSIFIABLE:
        raise invalid_arg(
            f"class result not available for output '{plan.name}' due to unsupported "
            f"type '{plan.datatype}'"
        )
    # FP16 / BF16 asked for as JSON is refused only when such an output is answered
    # (response.json_data), as Triton does: the model may not produce it at all
    return plan


def check_input_names(inputs: Sequence[DecodedInput], model: ModelVersionInfo) -> None:
    """No duplicates, no unknown names (named first: clearer than Triton's count message),
    then every required input present (Triton's message listing the missing ones)."""
    names = [tensor.name for tensor in inputs]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise duplicate_input(name)
        seen.add(name)
    known = {spec.name for spec in model.inputs}
    for name in names:
        if name not in known:
            raise unexpected_input(name, model.name)
    required = [spec.name for spec in model.inputs if not spec.optional]
    missing = [name for name in required if name not in seen]
    if missing:
        raise RequestCheckError(_count_message(names, required, missing, model))


def _count_message(
    names: list[str], required: list[str], missing: list[str], model: ModelVersionInfo
) -> str:
    def listing(items: list[str]) -> str:
        return "[" + ",".join(f"'{item}'" for item in items) + "]"

    if len(required) == len(model.inputs):
        expected = f"expected {len(model.inputs)} inputs"
    else:
        expected = f"expected number of inputs between {len(required)} and {len(model.inputs)}"
    return (
        f"{expected} but got {len(names)} inputs for model '{model.name}'. Got input(s) "
        f"{listing(names)}, but missing required input(s) {listing(missing)}. Please provide "
        "all required input(s)."
    )


def batch_size_of(inputs: Sequence[DecodedInput], model: ModelVersionInfo) -> int:
    """The shared leading dim when the model batches (max_batch_size > 0), else 1; 0 is
    refused by ``validate_request`` once the inputs' own checks passed."""
    if model.max_batch_size <= 0:
        return 1
    batch: int | None = None
    for tensor in inputs:
        if not tensor.shape:
            raise RequestCheckError(
                f"input '{tensor.name}' has no shape but model requires batch dimension for "
                f"'{model.name}'"
            )
        if batch is None:
            batch = tensor.shape[0]
        elif tensor.shape[0] != batch:
            raise RequestCheckError(
                f"input '{tensor.name}' batch size does not match other inputs for "
                f"'{model.name}'"
            )
    if batch is None:
        return 1
    if batch > model.max_batch_size:
        raise RequestCheckError(
            f"inference request batch-size must be <= {model.max_batch_size} for "
            f"'{model.name}'"
        )
    return batch


def check_datatype(tensor: DecodedInput, spec: TensorSpec, model_name: str) -> None:
    if tensor.datatype != spec.datatype:
        raise datatype_mismatch(tensor.name, tensor.datatype, model_name, spec.datatype)


# The errors of an input's name and datatype, for the checks here and for the decoders that
# find them first (generate's repeated input, gRPC's unknown datatype).


def duplicate_input(name: str) -> RequestCheckError:
    return RequestCheckError(f"input '{name}' already exists in request")


def unexpected_input(name: str, model_name: str) -> ShoalError:
    return invalid_arg(f"unexpected inference input '{name}' for model '{model_name}'")


def datatype_mismatch(name: str, given: str, model_name: str, expected: str
                      ) -> RequestCheckError:
    return RequestCheckError(f"inference input '{name}' data-type is '{given}', but model "
                             f"'{model_name}' expects '{expected}'")


def check_shape(tensor: DecodedInput, spec: TensorSpec, model: ModelVersionInfo) -> None:
    batching = model.max_batch_size > 0
    dims = tensor.shape[1:] if batching else tensor.shape
    if dims == spec.dims:
        return  # the usual case, in one list comparison
    matches = len(dims) == len(spec.dims) and all(
        want == -1 or want == got for want, got in zip(spec.dims, dims, strict=True)
    )
    if not matches:
        expected = ([-1] if batching else []) + list(spec.dims)
        raise RequestCheckError(
            f"unexpected shape for input '{tensor.name}' for model '{model.name}'. Expected "
            f"{format_dims(expected)}, got {format_dims(tensor.shape)}. "
            + (_BATCH_NOTE if batching else "")
        )


def check_byte_size(tensor: DecodedInput, model_name: str) -> None:
    """The bytes given (or ``shared_memory_byte_size``) match the shape. BYTES in shared memory
    are checked when the region is resolved (the registry reads the framing)."""
    if tensor.shm is not None:
        if tensor.datatype != "BYTES":
            _check_fixed_size(tensor, tensor.shm.byte_size, model_name)
        return
    if tensor.datatype == "BYTES":
        check_bytes_framing(tensor.data, tensor.element_count, tensor.name, model_name)
        return
    _check_fixed_size(tensor, len(tensor.data), model_name)


def _check_fixed_size(tensor: DecodedInput, given: int, model_name: str) -> None:
    expected = tensor.element_count * dtypes.element_size(tensor.datatype)
    if given != expected:
        raise RequestCheckError(
            f"input byte size mismatch for input '{tensor.name}' for model '{model_name}'. "
            f"Expected {expected}, got {given}"
        )


def check_bytes_framing(data: memoryview, count: int, name: str, model_name: str) -> None:
    """The buffer holds exactly ``count`` length-prefixed elements, nothing after them."""
    end = len(data)
    position = 0
    found = 0
    while position < end:
        if end - position < 4:
            raise short_length_indicator(name, model_name, end - position)
        (length,) = _LENGTH.unpack_from(data, position)
        position += 4
        if length > end - position:
            raise short_string_data(name, length, end - position)
        position += length
        found += 1
        if found > count:
            raise too_many_strings(name, model_name, found, count)
    if found != count:
        raise wrong_string_count(name, model_name, found, count)


# The errors of BYTES framing, in a request body (``check_bytes_framing``) and in a client's
# shared memory (``shm_checks.check_bytes_framing``) alike. Those of Triton's core are
# RequestCheckError: the caller adds the request's id (``validate_request``,
# ``infer_common.prepare_request``).


def _framing_where(name: str, model_name: str) -> str:
    return f"for inference input '{name}' for model '{model_name}'"


def short_length_indicator(name: str, model_name: str, available: int) -> RequestCheckError:
    return RequestCheckError(
        f"incomplete string length indicator {_framing_where(name, model_name)}, expecting 4 "
        f"bytes but only {available} bytes available. Please make sure the string length "
        "indicator is in one buffer."
    )


def short_string_data(name: str, length: int, available: int) -> ShoalError:
    return invalid_arg(  # Triton's python backend says this, without the model
        f"incomplete string data for inference input '{name}', expecting string of length "
        f"{length} but only {available} bytes available"
    )


def too_many_strings(name: str, model_name: str, found: int, count: int) -> RequestCheckError:
    return RequestCheckError(f"unexpected number of string elements {found} "
                             f"{_framing_where(name, model_name)}, expecting {count}")


def wrong_string_count(name: str, model_name: str, found: int, count: int) -> RequestCheckError:
    return RequestCheckError(
        f"expected {count} string elements {_framing_where(name, model_name)}, got {found}")
