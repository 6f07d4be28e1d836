"""The default intra-op thread count of CPU model instances (issue #16 part 1).

A CPU worker that runs its library's default (torch and onnxruntime: one thread per core) fights
the frontend and the broker for the same cores: on 2 cores the TorchScript MLP of
``bench/RESULTS.md`` served 2.3x MLServer that way and 4.3x with one torch thread. The policy:

- **usable cores** = the CPUs this process may run on (``os.sched_getaffinity``), lowered to the
  cgroup CPU quota when there is one (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` /
  ``cpu.cfs_period_us``; the smallest quota of the cgroup and its ancestors, rounded down,
  at least 1);
- **reserved** = one core per frontend process (``--http-workers``) plus one for the broker: both
  are busy on the hot path (the frontend's per-request HTTP work is the measured bound);
- **threads per CPU instance** = (usable - reserved) // CPU instances, **at least 1**: when the
  instances outnumber the cores left (or nothing is left, e.g. 2 cores with 1 frontend), every
  instance gets 1 thread, never 0; the machine is then shared by time, as it must be.

The broker decides, since it knows every instance: ``cpu_instances`` counts the CPU instances
it holds when a worker is spawned (the new one's model included), plus one for each model whose
config is still being read. A model loaded later does not shrink the pools of workers already
running; a worker gets the count of the moment it starts.
A model's ``INTRA_OP_THREAD_COUNT`` parameter (onnxruntime: ``intra_op_thread_count``) or
``--backend-config=<backend>,intra-op-thread-count=N`` still wins (pytorch: 0 there means torch's
own default). Pure functions here; ``read_cpu_budget`` is the one that reads the machine.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass

CGROUP_ROOT = "/sys/fs/cgroup"
_QuotaReader = Callable[[str], "float | None"]


@dataclass(frozen=True)
class CpuBudget:
    """The cores the server may use and where that number comes from (for the log line)."""

    cores: int
    source: str


@dataclass(frozen=True)
class ThreadShare:
    """Intra-op threads for each CPU instance, and why (one log line per model)."""

    threads: int
    reason: str


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 ``cpu.max`` ("QUOTA PERIOD" or "max PERIOD") -> CPUs; None when unlimited or
    unreadable."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    return _quota_cpus(parts[0], parts[1])


def parse_cfs_quota(quota_text: str, period_text: str) -> float | None:
    """cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` -> CPUs; None when unlimited (-1)."""
    return _quota_cpus(quota_text.strip(), period_text.strip())


def _quota_cpus(quota: str, period: str) -> float | None:
    try:
        quota_us, period_us = int(quota), int(period)
    except ValueError:
        return None
    if quota_us <= 0 or period_us <= 0:
        return None
    return quota_us / period_us


def usable_cores(affinity: int, quota_cpus: float | None) -> CpuBudget:
    """The cores of ``affinity`` CPUs under a quota of ``quota_cpus`` CPUs (None: no quota)."""
    cores = max(1, affinity)
    source = f"{cores} CPUs in the affinity mask"
    if quota_cpus is not None and math.floor(quota_cpus) < cores:
        cores = max(1, math.floor(quota_cpus))
        source = f"cgroup CPU quota {quota_cpus:g}"
    return CpuBudget(cores, source)


def intra_op_share(budget: CpuBudget, frontends: int, cpu_instances: int) -> ThreadShare:
    """Threads per CPU instance (see the module docstring); always at least 1."""
    reserved = max(frontends, 1) + 1
    left = max(budget.cores - reserved, 0)
    instances = max(cpu_instances, 1)
    threads = max(1, left // instances)
    why = (f"{budget.cores} usable cores ({budget.source}) - {reserved} reserved for "
           f"{max(frontends, 1)} frontend(s) and the broker = {left} for {instances} CPU "
           f"instance(s)")
    if left < instances:
        why += ": 1 thread each (the minimum)"
    return ThreadShare(threads, why)


# ---------------------------------------------------------------------- reading the machine


def read_cpu_budget(cgroup_root: str = CGROUP_ROOT, proc_cgroup: str = "/proc/self/cgroup",
                    ) -> CpuBudget:
    """``usable_cores`` of this process: its affinity and its cgroup's CPU quota."""
    if hasattr(os, "sched_getaffinity"):
        affinity = len(os.sched_getaffinity(0))
    else:  # pragma: no cover - not Linux
        affinity = os.cpu_count() or 1
    return usable_cores(affinity, read_cpu_quota(cgroup_root, proc_cgroup))


def read_cpu_quota(cgroup_root: str = CGROUP_ROOT, proc_cgroup: str = "/proc/self/cgroup",
                   ) -> float | None:
    """The smallest CPU quota (in CPUs) of this process's cgroup and its ancestors; None when
    there is none or it cannot be read."""
    try:
        with open(proc_cgroup, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            quotas += _quotas_up(cgroup_root, path, _read_v2)
        elif "cpu" in controllers.split(","):
            mount = os.path.join(cgroup_root, controllers)
            if not os.path.isdir(mount):
                mount = os.path.join(cgroup_root, "cpu")
            quotas += _quotas_up(mount, path, _read_v1)
    return min(quotas) if quotas else None


def _quotas_up(mount: str, path: str, read: _QuotaReader) -> list[float]:
    """The quotas of the cgroup at ``path`` under ``mount`` and of each ancestor up to the mount
    (a container sees its own cgroup as "/", so the mount itself is always read)."""
    found: list[float] = []
    parts = [p for p in path.strip("/").split("/") if p]
    for depth in range(len(parts), -1, -1):
        quota = read(os.path.join(mount, *parts[:depth]))
        if quota is not None:
            found.append(quota)
    return found


def _read_v2(directory: str) -> float | None:
    text = _read_text(os.path.join(directory, "cpu.max"))
    return parse_cpu_max(text) if text is not None else None


def _read_v1(directory: str) -> float | None:
    quota = _read_text(os.path.join(directory, "cpu.cfs_quota_us"))
    period = _read_text(os.path.join(directory, "cpu.cfs_period_us"))
    if quota is None or period is None:
        return None
    return parse_cfs_quota(quota, period)


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None

