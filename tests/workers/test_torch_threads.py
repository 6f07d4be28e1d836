"""Torch intra-op threads of pytorch and python workers (backends/torch_threads.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from shoal.errors import ShoalError
from shoal.workers.backends.torch_threads import apply_intra_op_threads


@pytest.fixture(autouse=True)
def _restore_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_policy_count_applies_when_the_model_names_none() -> None:
    assert apply_intra_op_threads(torch, {}, {}, 1) == 1
    assert torch.get_num_threads() == 1


def test_the_parameter_wins_over_the_setting_and_the_policy() -> None:
    count = apply_intra_op_threads(torch, {"INTRA_OP_THREAD_COUNT": "2"},
                                   {"intra-op-thread-count": "3"}, 1)
    assert count == 2


def test_the_backend_setting_wins_over_the_policy() -> None:
    assert apply_intra_op_threads(torch, {}, {"intra-op-thread-count": "2"}, 1) == 2


def test_a_named_zero_keeps_torchs_default() -> None:
    torch.set_num_threads(2)
    assert apply_intra_op_threads(torch, {"INTRA_OP_THREAD_COUNT": "0"}, {}, 1) == 2


def test_no_policy_and_no_count_leaves_torch_alone() -> None:
    torch.set_num_threads(2)
    assert apply_intra_op_threads(torch, {}, {}, 0) == 2


def test_a_bad_count_is_refused_naming_the_setting() -> None:
    with pytest.raises(ShoalError, match="intra-op-thread-count must be a non-negative integer"):
        apply_intra_op_threads(torch, {"INTRA_OP_THREAD_COUNT": "two"}, {}, 1)
