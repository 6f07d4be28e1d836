"""Ragged batching on the worker side: Triton's ``allow_ragged_batch`` inputs, ``batch_input``
tensors and ``batch_output`` scatter, plus shoal's padding mode. Pure numpy; no torch.

Triton semantics (backend ``BackendInputCollector`` / ``BackendOutputResponder``, pytorch and
onnxruntime backends), for the N requests of one batch, where a request's "shape" is its full
shape (batch dim included) and its element count is the product of that shape:

- a ragged input (``allow_ragged_batch: true``) reaches the model as the 1-D concatenation of
  every request's elements, shape ``[sum of element counts]`` (its ``reshape`` is not applied);
- ``batch_input`` tensors, data type INT32 or FP32, one per ``target_name``, from the shapes of
  the ``source_input`` in each request:
    BATCH_ELEMENT_COUNT                        ``[N]``: element count of each request;
    BATCH_ACCUMULATED_ELEMENT_COUNT            ``[N]``: running sum of the element counts;
    BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO  ``[N + 1]``: 0, then the running sum;
    BATCH_MAX_ELEMENT_COUNT_AS_SHAPE           ``[max element count]``: only the shape carries
                                               information (Triton leaves the data uninitialized;
                                               here it is zeros);
    BATCH_ITEM_SHAPE                           ``[total batch, ndims - 1]``: each batch item's
                                               shape without the batch dim (a request of batch
                                               size b contributes b equal rows);
    BATCH_ITEM_SHAPE_FLATTEN                   the same values, 1-D ``[total batch * (ndims-1)]``;
- ``batch_output`` BATCH_SCATTER_WITH_INPUT_SHAPE: the model's output is read flat and cut, in
  request order, into pieces of shape ``[-1] + dims`` (``reshape.shape`` when given; no ``-1``
  prefix when ``max_batch_size`` is 0) where every ``-1`` at position k is the k-th dim of the
  request's ``source_input``.

Padding mode (a shoal extension, for models that want dense tensors). Model config parameters::

    parameters { key: "shoal_pad_ragged_inputs"  value { string_value: "MASK" } }
    parameters { key: "shoal_pad_mask_data_type" value { string_value: "TYPE_INT64" } }

The first names the generated mask input, optionally followed by ``:<source input>``
("MASK:INPUT_IDS"); the source defaults to the first ragged input in config order. The second is
optional (TYPE_INT64 by default; TYPE_BOOL, TYPE_INT32 and TYPE_FP32 are also accepted). Then each
ragged input, instead of being flattened, is padded with zeros (b"" for BYTES) at the end of each
non-batch dim to the largest size in the batch: shape ``[total batch, max d1, max d2, ...]``; the
mask has the padded shape of its source and is 1 where an element is real, 0 where it is padding.
``batch_input`` tensors are still built as above. A BATCH_SCATTER_WITH_INPUT_SHAPE output is then
cut by rows (each request's batch size) and every ``-1`` dim after the batch dim is cropped to the
source input's size, which removes the padding; other outputs are split by rows and keep the
padded size. The mask counts as a model input after the batch inputs (forward() argument order).

The broker may batch requests whose ragged inputs differ in shape: the shapes of inputs with
``allow_ragged_batch`` are left out of its batching signature (in both modes).

Here: what a model's config asks (``RaggedConfig``, checked at load) and the generated inputs
and cut outputs of one batch; the array operations themselves are in ``ragged_tensors.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from shoal.dtypes import config_to_wire, numpy_dtype
from shoal.errors import invalid_arg
from shoal.workers.ragged_tensors import (
    Array,
    Shape,
    batch_input_array,
    crop_padded_output,
    padding_mask,
    scatter_output,
)

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

PAD_PARAMETER: Final = "shoal_pad_ragged_inputs"
PAD_MASK_TYPE_PARAMETER: Final = "shoal_pad_mask_data_type"
BATCH_INPUT_KINDS: Final = (
    "BATCH_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
    "BATCH_ITEM_SHAPE", "BATCH_ITEM_SHAPE_FLATTEN",
)
SCATTER_WITH_INPUT_SHAPE: Final = "BATCH_SCATTER_WITH_INPUT_SHAPE"
_BATCH_INPUT_TYPES: Final = ("INT32", "FP32")
_MASK_TYPES: Final = ("BOOL", "INT32", "INT64", "FP32")
_DEFAULT_MASK_TYPE: Final = "INT64"


@dataclass(frozen=True)
class BatchInputSpec:
    kind: str  # one of BATCH_INPUT_KINDS
    targets: tuple[str, ...]
    datatype: str  # wire name: "INT32" or "FP32"
    source: str


@dataclass(frozen=True)
class ScatterSpec:
    target: str
    source: str
    shape: Shape  # [-1] + (reshape.shape or dims); no -1 prefix without batching
    batched: bool  # max_batch_size > 0: shape[0] is the batch dim


@dataclass(frozen=True)
class PaddingSpec:
    mask: str
    source: str
    datatype: str  # wire name


@dataclass(frozen=True)
class RaggedConfig:
    """What a model's config asks of ragged batching; empty (``active`` False) for most."""

    ragged_inputs: frozenset[str] = frozenset()
    batch_inputs: tuple[BatchInputSpec, ...] = ()
    scatter_outputs: Mapping[str, ScatterSpec] = field(default_factory=dict)
    padding: PaddingSpec | None = None

    @property
    def active(self) -> bool:
        return bool(self.ragged_inputs or self.batch_inputs or self.scatter_outputs)

    @property
    def extra_input_names(self) -> list[str]:
        """Model inputs generated here, in forward() order: batch input targets, then the mask."""
        names = [target for spec in self.batch_inputs for target in spec.targets]
        if self.padding is not None:
            names.append(self.padding.mask)
        return names

    @classmethod
    def from_model_config(cls, config: ModelConfig, model_name: str) -> RaggedConfig:
        """Parse and check ``config`` (a ``model_config_pb2.ModelConfig``); INVALID_ARG errors
        name the field at fault."""
        from tritonclient.grpc import model_config_pb2 as pb

        inputs = [str(io.name) for io in config.input]
        ragged = frozenset(str(io.name) for io in config.input if io.allow_ragged_batch)
        taken = set(inputs)
        batch_inputs: list[BatchInputSpec] = []
        for i, entry in enumerate(config.batch_input):
            where = f"model '{model_name}': batch_input[{i}]"
            kind = pb.BatchInput.Kind.Name(entry.kind)
            datatype = config_to_wire(pb.DataType.Name(entry.data_type))
            if datatype not in _BATCH_INPUT_TYPES:
                raise invalid_arg(f"{where}.data_type: must be TYPE_INT32 or TYPE_FP32")
            source = _single_source(entry.source_input, inputs, where)
            targets = tuple(str(name) for name in entry.target_name)
            if not targets:
                raise invalid_arg(f"{where}.target_name: at least one name is required")
            for name in targets:
                if name in taken:
                    raise invalid_arg(f"{where}.target_name: '{name}' is already a model input")
                taken.add(name)
            batch_inputs.append(BatchInputSpec(kind, targets, datatype, source))
        scatter = _scatter_outputs(config, inputs, model_name)
        padding = _padding(config, inputs, ragged, taken, model_name)
        return cls(ragged, tuple(batch_inputs), scatter, padding)

    def extra_inputs(self, source_shapes: Sequence[Mapping[str, Shape]]
                     ) -> list[tuple[str, str, Array]]:
        """(name, wire datatype, array) of every generated input for a batch whose i-th request
        has input shapes ``source_shapes[i]``."""
        extras: list[tuple[str, str, Array]] = []
        for spec in self.batch_inputs:
            shapes = [shapes_of[spec.source] for shapes_of in source_shapes]
            array = batch_input_array(spec.kind, spec.datatype, shapes)
            extras.extend((target, spec.datatype, array) for target in spec.targets)
        if self.padding is not None:
            shapes = [shapes_of[self.padding.source] for shapes_of in source_shapes]
            extras.append((self.padding.mask, self.padding.datatype,
                           padding_mask(shapes, self.padding.datatype)))
        return extras

    def split_output(self, spec: ScatterSpec, array: Array,
                     source_shapes: Sequence[Shape]) -> list[Array]:
        """One piece of a BATCH_SCATTER_WITH_INPUT_SHAPE output per request."""
        if self.padding is not None:
            return crop_padded_output(array, spec.shape, source_shapes, spec.batched)
        return scatter_output(array, spec.shape, source_shapes)

    def workspace_bytes(self, max_rows: int, dims: Mapping[str, Shape]) -> int:
        """An upper bound on the bytes of the generated inputs for batches of up to
        ``max_rows`` items, given each input's config dims (without the batch dim); 0 when
        nothing is generated. Sources with variable dims add nothing (the caller sizes those)."""
        rows = max(max_rows, 1)
        total = 0
        for spec in self.batch_inputs:
            source = dims[spec.source]
            per_row = max(math.prod(source), len(source)) if min(source, default=0) >= 0 else 0
            total += len(spec.targets) * (rows * per_row + rows + 1) * 4
        if self.padding is not None and min(dims[self.padding.source], default=0) >= 0:
            mask_type = numpy_dtype(self.padding.datatype)
            total += rows * math.prod(dims[self.padding.source]) * mask_type.itemsize
        return total


def _single_source(names: Sequence[str], inputs: list[str], where: str) -> str:
    if len(names) != 1:
        raise invalid_arg(f"{where}.source_input: expects 1 source input, got {len(names)}")
    source = str(names[0])
    if source not in inputs:
        raise invalid_arg(f"{where}.source_input: unknown input '{source}'")
    return source


def _scatter_outputs(config: ModelConfig, inputs: list[str], model_name: str
                     ) -> dict[str, ScatterSpec]:
    from tritonclient.grpc import model_config_pb2 as pb

    outputs = {str(io.name): io for io in config.output}
    prefix: Shape = (-1,) if config.max_batch_size > 0 else ()
    scatter: dict[str, ScatterSpec] = {}
    for i, entry in enumerate(config.batch_output):
        where = f"model '{model_name}': batch_output[{i}]"
        kind = pb.BatchOutput.Kind.Name(entry.kind)
        if kind != SCATTER_WITH_INPUT_SHAPE:
            raise invalid_arg(f"{where}.kind: unsupported kind {kind}")
        source = _single_source(entry.source_input, inputs, where)
        for name in entry.target_name:
            io = outputs.get(str(name))
            if io is None:
                raise invalid_arg(f"{where}.target_name: unknown output '{name}'")
            if str(name) in scatter:
                raise invalid_arg(f"{where}.target_name: output '{name}' is named twice")
            dims = io.reshape.shape if io.HasField("reshape") else io.dims
            scatter[str(name)] = ScatterSpec(str(name), source,
                                             prefix + tuple(int(d) for d in dims), bool(prefix))
    return scatter


def _padding(config: ModelConfig, inputs: list[str], ragged: frozenset[str], taken: set[str],
             model_name: str) -> PaddingSpec | None:
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    value = parameters.get(PAD_PARAMETER, "").strip()
    where = f"model '{model_name}': parameters['{PAD_PARAMETER}']"
    if not value:
        if PAD_PARAMETER in parameters:
            raise invalid_arg(f"{where}: the value must name the mask input")
        return None
    mask, _, source = (part.strip() for part in value.partition(":"))
    ragged_in_order = [name for name in inputs if name in ragged]
    if not ragged_in_order:
        raise invalid_arg(f"{where}: no input has allow_ragged_batch: true")
    if not mask or mask in taken:
        raise invalid_arg(f"{where}: mask input name '{mask}' is empty or already an input")
    source = source or ragged_in_order[0]
    if source not in ragged:
        raise invalid_arg(f"{where}: mask source '{source}' is not an input with "
                          "allow_ragged_batch: true")
    type_text = parameters.get(PAD_MASK_TYPE_PARAMETER, "").strip() or _DEFAULT_MASK_TYPE
    datatype = type_text.removeprefix("TYPE_")
    if datatype not in _MASK_TYPES:
        raise invalid_arg(f"model '{model_name}': parameters['{PAD_MASK_TYPE_PARAMETER}']: "
                          f"'{type_text}' is not one of TYPE_BOOL, TYPE_INT32, TYPE_INT64, "
                          "TYPE_FP32")
    return PaddingSpec(mask, source, datatype)
