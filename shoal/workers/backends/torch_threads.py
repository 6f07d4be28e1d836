"""Torch's intra-op thread count for a worker process (pytorch and python backends).

A count the model names wins: the config parameter ``INTRA_OP_THREAD_COUNT``, else the backend
setting ``--backend-config=<backend>,intra-op-thread-count=N``; 0 there keeps torch's own default
(one thread per core). Without one, a CPU instance gets the server's thread policy
(``InstanceContext.default_intra_op_threads``, ``shoal/broker/thread_policy.py``); 0 (an
accelerator instance) leaves torch alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shoal.errors import invalid_arg

PARAMETER = "INTRA_OP_THREAD_COUNT"
SETTING = "intra-op-thread-count"


def named_intra_op_threads(params: Mapping[str, str], settings: Mapping[str, str]) -> int | None:
    """The count the model names (None: none); raises INVALID_ARG for a negative or non-integer
    count."""
    text = params.get(PARAMETER) or settings.get(SETTING)
    return non_negative_int(text, SETTING) if text else None


def non_negative_int(text: str, name: str) -> int:
    """``text`` as an integer ≥ 0; raises INVALID_ARG naming ``name`` otherwise."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise invalid_arg(f"{name} must be a non-negative integer, got '{text}'")
    return value


def apply_intra_op_threads(torch: Any, params: Mapping[str, str], settings: Mapping[str, str],
                           default_intra: int) -> int:
    """Set torch's intra-op threads as the module docstring says; returns the count in effect."""
    named = named_intra_op_threads(params, settings)
    count = default_intra if named is None else named
    if count > 0:
        torch.set_num_threads(count)
    return int(torch.get_num_threads())
