"""Ragged batching's tensors (docs/architecture.md §5 and §7): pure numpy, no torch.

The arrays ``ragged.RaggedConfig`` generates and cuts, with Triton's semantics (the rules are
in ``ragged.py``'s docstring), for the N requests of one batch, where a request's "shape" is
its full shape (batch dim included):

- ``batch_input_array``: one ``batch_input`` kind's tensor from the source input's shapes;
- ``flatten_ragged``: a ragged input as the 1-D concatenation of every request's elements;
- ``padded_shape`` / ``pad_ragged`` / ``padding_mask``: shoal's padding mode, each request
  padded at the end of every non-batch dim to the batch's largest, and the mask of real
  elements;
- ``scatter_shapes`` / ``scatter_output``: BATCH_SCATTER_WITH_INPUT_SHAPE, the model's flat
  output cut into one piece per request; ``crop_padded_output``: the same in padding mode,
  split by rows and cropped to each request's source size.

Zero-copy where it can be: concatenations use ``batch_assembly.concat_rows`` (a view when the
requests lie back to back), outputs are views of the model's array. Shape problems raise
INVALID_ARG (the request's inputs) or INTERNAL (the model's outputs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from shoal.dtypes import numpy_dtype
from shoal.errors import ErrorCode, ShoalError, invalid_arg
from shoal.workers.batch_assembly import concat_rows, split_rows

Array = npt.NDArray[Any]
Shape = tuple[int, ...]


# ------------------------------------------------------------------ batch inputs


def batch_input_array(kind: str, datatype: str, source_shapes: Sequence[Shape]) -> Array:
    """The ``kind`` batch input (see the module docstring) for requests whose source input has
    the given full shapes."""
    dtype = numpy_dtype(datatype)
    counts = np.array([math.prod(shape) for shape in source_shapes], dtype=np.int64)
    if kind == "BATCH_ELEMENT_COUNT":
        return counts.astype(dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
        return np.cumsum(counts).astype(dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
        return np.concatenate([np.zeros(1, np.int64), np.cumsum(counts)]).astype(dtype)
    if kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
        return np.zeros(int(counts.max(initial=0)), dtype=dtype)
    if kind in ("BATCH_ITEM_SHAPE", "BATCH_ITEM_SHAPE_FLATTEN"):
        items = _item_shapes(source_shapes).astype(dtype)
        return items.reshape(-1) if kind == "BATCH_ITEM_SHAPE_FLATTEN" else items
    raise invalid_arg(f"unsupported batch_input kind '{kind}'")


def _item_shapes(source_shapes: Sequence[Shape]) -> npt.NDArray[np.int64]:
    """``[total batch, ndims - 1]``: each request's shape without its batch dim, repeated once
    per batch item."""
    ndims = {len(shape) for shape in source_shapes}
    if len(ndims) > 1 or 0 in ndims:
        raise invalid_arg("BATCH_ITEM_SHAPE needs source inputs with a batch dim and the same "
                          f"number of dims, got shapes {[list(s) for s in source_shapes]}")
    width = ndims.pop() - 1 if ndims else 0
    rows = np.array([shape[1:] for shape in source_shapes], dtype=np.int64)
    rows = rows.reshape(len(source_shapes), width)
    return np.repeat(rows, [shape[0] for shape in source_shapes], axis=0)


# ------------------------------------------------------------------ ragged inputs


def flatten_ragged(arrays: Sequence[Array], out: Array | None = None) -> Array:
    """Triton's ragged input: every request's elements, concatenated into one 1-D array.
    Zero-copy when the requests lie back to back in one buffer (see ``concat_rows``); else one
    copy into ``out`` (shape ``[total elements]``) or a new array."""
    return concat_rows([array.reshape(-1) for array in arrays], out=out)


def padded_shape(shapes: Sequence[Shape]) -> Shape:
    """``[sum of batch dims, max d1, max d2, ...]`` over requests of one rank."""
    if not shapes or len({len(shape) for shape in shapes}) != 1 or not shapes[0]:
        raise invalid_arg("ragged inputs to pad must have a batch dim and the same number of "
                          f"dims, got shapes {[list(s) for s in shapes]}")
    rank = len(shapes[0])
    return (sum(shape[0] for shape in shapes),
            *(max(shape[k] for shape in shapes) for k in range(1, rank)))


def pad_ragged(arrays: Sequence[Array], out: Array | None = None) -> Array:
    """The requests' rows stacked into one dense array of ``padded_shape``, each padded with
    zeros (b"" for object arrays) at the end of every non-batch dim. Written into ``out`` when
    given (it must have the padded shape and the arrays' dtype)."""
    shape = padded_shape([tuple(array.shape) for array in arrays])
    if all(tuple(array.shape[1:]) == shape[1:] for array in arrays):
        return concat_rows(arrays, out=out)
    dtype = arrays[0].dtype
    if out is None:
        out = np.empty(shape, dtype=dtype)
    elif out.shape != shape or out.dtype != dtype:
        raise ValueError(f"out has shape {list(out.shape)} and dtype {out.dtype}, expected "
                         f"{list(shape)} and {dtype}")
    out.fill(b"" if dtype.hasobject else 0)
    row = 0
    for array in arrays:
        out[_region(row, array.shape)] = array
        row += array.shape[0]
    return out


def padding_mask(shapes: Sequence[Shape], datatype: str) -> Array:
    """1 where the padded tensor of ``shapes`` holds a real element, 0 where it is padding."""
    mask = np.zeros(padded_shape(shapes), dtype=numpy_dtype(datatype))
    row = 0
    for shape in shapes:
        mask[_region(row, shape)] = 1
        row += shape[0]
    return mask


def _region(row: int, shape: Sequence[int]) -> tuple[slice, ...]:
    return (slice(row, row + shape[0]), *(slice(0, size) for size in shape[1:]))


# ------------------------------------------------------------------ batch outputs


def scatter_shapes(output_shape: Shape, source_shapes: Sequence[Shape]) -> list[Shape]:
    """Each request's output shape: ``output_shape`` with every -1 at position k replaced by the
    k-th dim of that request's source input."""
    result: list[Shape] = []
    for source in source_shapes:
        if any(d < 0 and k >= len(source) for k, d in enumerate(output_shape)):
            raise ShoalError(ErrorCode.INTERNAL, f"batch_output shape {list(output_shape)} has "
                             f"more dims than its source input {list(source)}")
        result.append(tuple(source[k] if d < 0 else d for k, d in enumerate(output_shape)))
    return result


def scatter_output(array: Array, output_shape: Shape,
                   source_shapes: Sequence[Shape]) -> list[Array]:
    """BATCH_SCATTER_WITH_INPUT_SHAPE: consecutive pieces of the flat ``array``, one per
    request, shaped by ``scatter_shapes``. Views of ``array`` when it is contiguous."""
    flat = array.reshape(-1)
    shapes = scatter_shapes(output_shape, source_shapes)
    needed = sum(math.prod(shape) for shape in shapes)
    if needed > flat.size:
        raise ShoalError(ErrorCode.INTERNAL, f"batch output of {flat.size} elements is too "
                         f"small to scatter into shapes {[list(s) for s in shapes]}")
    pieces: list[Array] = []
    start = 0
    for shape in shapes:
        count = math.prod(shape)
        pieces.append(flat[start:start + count].reshape(shape))
        start += count
    return pieces


def crop_padded_output(array: Array, output_shape: Shape, source_shapes: Sequence[Shape],
                       batched: bool) -> list[Array]:
    """Padding mode: split ``array`` by each request's batch dim (rows) when ``batched``, then
    crop every -1 dim after the batch dim (every -1 dim when not batched) to the request's
    source input size. Views of ``array``."""
    shapes = scatter_shapes(output_shape, source_shapes)
    if not batched:
        return [_crop(array, shape, output_shape, 0) for shape in shapes]
    if array.ndim != len(output_shape):
        raise ShoalError(ErrorCode.INTERNAL, f"padded output has shape {list(array.shape)}, "
                         f"expected {len(output_shape)} dims")
    rows = split_rows(array, [shape[0] for shape in shapes])
    return [_crop(part, shape, output_shape, 1)
            for part, shape in zip(rows, shapes, strict=True)]


def _crop(array: Array, shape: Shape, output_shape: Shape, first: int) -> Array:
    if array.ndim != len(shape):
        raise ShoalError(ErrorCode.INTERNAL, f"padded output has shape {list(array.shape)}, "
                         f"expected {len(shape)} dims")
    region: list[slice] = []
    for k, size in enumerate(shape):
        if k >= first and output_shape[k] < 0:
            if array.shape[k] < size:
                raise ShoalError(ErrorCode.INTERNAL, f"padded output has shape "
                                 f"{list(array.shape)}, too small for {list(shape)}")
            region.append(slice(0, size))
        else:
            region.append(slice(None))
    return array[tuple(region)]
