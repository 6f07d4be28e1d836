"""A config's ``reshape`` applied as Triton's core applies it for every backend: an input of
``dims`` reaches the model in the ``reshape`` shape, and an output the model produced in the
``reshape`` shape leaves in the ``dims`` shape (the batch dimension, when the model batches,
stays in front either way). Works from the ``torchscript_io.IoSpec`` of each tensor; used by
the python backend.

Variable-size dimensions: the ``-1`` entries of the target take, in order, the sizes the
array has at the ``-1`` entries of the source (the config checks made both lists have the
same variable-size dimensions, ``model_config_checks._validate_io_shape``), so several of
them map correctly. An array whose shape does not fit the source (a model that produced an
output of another rank or size) is left as it is. Reshaping never copies: the model gets a
view of the request's memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from shoal.config.model_config_checks import WILDCARD_DIM
from shoal.workers.backends.torchscript_io import IoSpec, io_spec


def reshapes(ios: Iterable[Any]) -> dict[str, IoSpec]:
    """Tensor name -> its IoSpec, for the config inputs or outputs that have a ``reshape``."""
    return {io.name: io_spec(io) for io in ios if io.HasField("reshape")}


def to_model(array: Any, spec: IoSpec, batching: bool) -> Any:
    """An input as the model sees it: ``dims`` -> ``reshape.shape``."""
    if spec.reshape is None:
        return array
    return _mapped(array, spec.dims, spec.reshape, batching)


def to_client(array: Any, spec: IoSpec, batching: bool) -> Any:
    """An output as the client gets it: ``reshape.shape`` -> ``dims``."""
    if spec.reshape is None:
        return array
    return _mapped(array, spec.reshape, spec.dims, batching)


def _mapped(array: Any, source: tuple[int, ...], target: tuple[int, ...],
            batching: bool) -> Any:
    shape = tuple(int(d) for d in array.shape)
    prefix, rest = (shape[:1], shape[1:]) if batching else ((), shape)
    if batching and not shape:
        return array
    dims = mapped_dims(rest, source, target)
    if dims is None or prefix + dims == shape:
        return array
    return array.reshape(prefix + dims)


def mapped_dims(shape: Sequence[int], source: Sequence[int], target: Sequence[int]
                ) -> tuple[int, ...] | None:
    """``shape`` (which fits ``source``) expressed in ``target``'s dimensions, or None when
    ``shape`` does not fit ``source`` or the result would not hold the same elements."""
    if len(shape) != len(source) or any(
            s != WILDCARD_DIM and s != d for s, d in zip(source, shape, strict=True)):
        return None
    variable = [d for s, d in zip(source, shape, strict=True) if s == WILDCARD_DIM]
    dims: list[int] = []
    for t in target:
        if t != WILDCARD_DIM:
            dims.append(t)
        elif variable:
            dims.append(variable.pop(0))
        else:
            return None
    if variable or math.prod(dims) != math.prod(shape):
        return None
    return tuple(dims)
