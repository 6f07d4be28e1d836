"""Torch intra-op threads of an ``llm`` worker.

The count comes from the config parameter ``INTRA_OP_THREAD_COUNT`` (as the pytorch backend),
else the backend setting ``--backend-config=llm,intra-op-thread-count=N``, else a default that
leaves the frontend and broker a core: the CPUs this process may run on, divided among the
model's CPU instances, minus one when that leaves at least one. A worker whose OpenMP threads
take every core competes with the processes that stream its tokens: the threads spin between
the many small matmuls of a decoding step, and each token then waits for a core to reach the
client (measured: bench/RESULTS.md, LLM serving). Accelerator instances keep one host thread.
A CPU instance the broker gave a thread-policy count (``policy``, from
``shoal/broker/thread_policy.py``: the cores left after the frontends and the broker, shared
among every model's CPU instances) uses that instead of the per-model default.
"""

from __future__ import annotations

import os
from typing import Any

from shoal.errors import invalid_arg

PARAMETER = "INTRA_OP_THREAD_COUNT"
SETTING = "intra-op-thread-count"
_KIND_GPU = 1  # model_config.proto ModelInstanceGroup.Kind


def thread_count(parameters: dict[str, str], backend_settings: dict[str, str], config: Any,
                 device: str, policy: int = 0) -> int:
    """Raises INVALID_ARG for a count that is not a positive integer."""
    text = (parameters.get(PARAMETER) or backend_settings.get(SETTING) or "").strip()
    if text:
        try:
            count = int(text)
        except ValueError:
            count = 0
        if count < 1:
            raise invalid_arg(f"llm backend: {PARAMETER} must be a positive integer, "
                              f"got '{text}'")
        return count
    if device != "cpu":
        return 1
    if policy > 0:
        return policy
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    instances = sum(max(int(group.count), 1) for group in config.instance_group
                    if group.kind != _KIND_GPU) or 1
    share = max(1, (cpus or 1) // instances)
    return share - 1 if share > 1 else 1


def configure_threads(parameters: dict[str, str], backend_settings: dict[str, str],
                      config: Any, device: str, policy: int = 0) -> int:
    """Set torch's intra-op thread count for this worker process; returns it."""
    import torch

    count = thread_count(parameters, backend_settings, config, device, policy)
    torch.set_num_threads(count)
    return count
