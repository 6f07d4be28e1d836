"""``shoal.workers.backends.reshape``: a config ``reshape`` applied as Triton's core applies
it, from each tensor's ``IoSpec``; several variable-size dimensions map in order."""

from __future__ import annotations

import numpy as np

from shoal.workers.backends.reshape import mapped_dims, to_client, to_model
from shoal.workers.backends.torchscript_io import IoSpec

SPEC = IoSpec("X", "FP32", (-1, 4, -1), (-1, 2, 2, -1))


def test_several_variable_dims_map_in_order_both_ways() -> None:
    array = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)  # batch of 2
    seen = to_model(array, SPEC, batching=True)
    assert seen.shape == (2, 3, 2, 2, 5) and np.shares_memory(seen, array)
    assert to_client(seen, SPEC, batching=True).shape == (2, 3, 4, 5)
    assert to_model(array[0], SPEC, batching=False).shape == (3, 2, 2, 5)


def test_a_shape_that_does_not_fit_is_left_as_it_is() -> None:
    array = np.zeros((3, 5, 5), np.float32)
    assert to_model(array, SPEC, batching=False) is array
    assert mapped_dims((3, 4), (-1, 4), (-1, -1)) is None  # a variable dim with no source
    assert mapped_dims((), (), ()) == ()


def test_a_spec_without_reshape_changes_nothing() -> None:
    array = np.zeros((2, 4), np.float32)
    plain = IoSpec("X", "FP32", (4,), None)
    assert to_model(array, plain, batching=True) is array
    assert to_client(array, plain, batching=True) is array
