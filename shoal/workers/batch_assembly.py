"""Joining the requests of a batch along dim 0, and splitting results back (docs/architecture.md
§7).

A worker maps each request's input slice from shared memory. When the frontend placed the slices
of one batch back to back in one segment, the batch is already contiguous: ``concat_rows`` then
returns a zero-copy view spanning them. Otherwise it makes exactly one copy (into ``out`` when the
caller gives one, e.g. a view of the workspace pool, so the hot path allocates nothing).

Ownership: a zero-copy view aliases the request arrays' memory (and keeps the underlying buffer
object alive); it is valid as long as that memory is, i.e. until the backend's ``execute`` returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]


def concat_rows(arrays: Sequence[Array], out: Array | None = None) -> Array:
    """Concatenate ``arrays`` along dim 0.

    Zero-copy when every array is C-contiguous with the same dtype and trailing shape and each
    starts exactly where the previous one ends inside one buffer; otherwise one copy into ``out``
    (which must have the concatenated shape and the common dtype) or into a new array.
    """
    if not arrays:
        raise ValueError("concat_rows needs at least one array")
    view = adjacent_view(arrays)
    if view is not None:
        return view
    return copy_rows(arrays, out)


def copy_rows(arrays: Sequence[Array], out: Array | None = None) -> Array:
    """``concat_rows`` without trying the zero-copy view: always one copy (into ``out``, which
    must have the concatenated shape and the common dtype, or into a new array)."""
    if not arrays:
        raise ValueError("copy_rows needs at least one array")
    first = arrays[0]
    trailing = first.shape[1:]
    for array in arrays[1:]:
        if array.shape[1:] != trailing:
            raise ValueError(
                f"cannot batch arrays of shapes {list(first.shape)} and {list(array.shape)}: "
                "all dims after the batch dim must match")
    shape = (sum(int(a.shape[0]) for a in arrays), *trailing)
    if out is None:
        out = np.empty(shape, dtype=first.dtype)
    elif out.shape != shape or out.dtype != first.dtype:
        raise ValueError(f"out has shape {list(out.shape)} and dtype {out.dtype}, "
                         f"expected {list(shape)} and {first.dtype}")
    np.concatenate(arrays, axis=0, out=out)
    return out


def adjacent_view(arrays: Sequence[Array]) -> Array | None:
    """The zero-copy view spanning ``arrays`` when they lie back to back in one buffer, else None.

    A single C-contiguous array is returned as is.
    """
    first = arrays[0]
    dtype = first.dtype
    trailing = first.shape[1:]
    if dtype.hasobject or first.ndim == 0 or not first.flags.c_contiguous:
        return None
    if len(arrays) == 1:
        return first
    start = _address(first)  # one address per array: each costs about a microsecond
    expected = start + first.nbytes
    rows = int(first.shape[0])
    for array in arrays[1:]:
        if (array.dtype != dtype or array.shape[1:] != trailing
                or not array.flags.c_contiguous or _address(array) != expected):
            return None
        expected += array.nbytes
        rows += int(array.shape[0])
    return _view_of_span(first, start, expected, (rows, *trailing))


def split_rows(array: Array, batch_sizes: Sequence[int]) -> list[Array]:
    """Views of consecutive row ranges of ``array``, one per batch size."""
    total = sum(batch_sizes)
    if array.ndim == 0 or array.shape[0] != total:
        shape = list(array.shape)
        raise ValueError(f"cannot split shape {shape} into batches of {list(batch_sizes)}")
    views: list[Array] = []
    start = 0
    for size in batch_sizes:
        views.append(array[start:start + size])
        start += size
    return views


def copy_if_aliases(array: Array, sources: Sequence[Array]) -> Array:
    """``array`` itself, or a copy of it when it may share memory with one of ``sources``.

    Used on outputs: a model that returns (a view of) its input would otherwise hand the worker
    memory that is only valid until ``execute`` returns. The check is a cheap bounds test.
    """
    if array.dtype.hasobject:
        return array
    for source in sources:
        if not source.dtype.hasobject and np.may_share_memory(array, source):
            return array.copy()
    return array


def _address(array: Array) -> int:
    return int(array.ctypes.data)


def _view_of_span(first: Array, start: int, end: int, shape: tuple[int, ...]) -> Array | None:
    """A view of bytes [start, end) built on the buffer that owns ``first``'s memory, or None
    when that buffer does not cover the whole span (the arrays only look adjacent)."""
    owner = _root_buffer(first)
    try:
        whole = np.frombuffer(owner, dtype=np.uint8)
    except (TypeError, ValueError, BufferError):
        return None
    base = _address(whole) if whole.size else 0
    if start < base or end > base + whole.nbytes:
        return None
    count = (end - start) // first.dtype.itemsize
    return np.frombuffer(owner, dtype=first.dtype, count=count,
                         offset=start - base).reshape(shape)


def _root_buffer(array: Array) -> Any:
    root: Any = array
    while isinstance(root, np.ndarray) and root.base is not None:
        root = root.base
    if isinstance(root, memoryview) and root.obj is not None:
        return root.obj
    return root
