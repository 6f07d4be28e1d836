"""The default thread policy of CPU instances (shoal/broker/thread_policy.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from shoal.broker.model_runtime import InstanceSlot
from shoal.broker.models import ModelManager
from shoal.broker.thread_policy import (
    CpuBudget,
    intra_op_share,
    parse_cfs_quota,
    parse_cpu_max,
    read_cpu_quota,
    usable_cores,
)
from shoal.settings import settings_from_flags


def test_cpu_max_quota_in_cpus_and_unlimited() -> None:
    assert parse_cpu_max("150000 100000\n") == 1.5
    assert parse_cpu_max("max 100000\n") is None
    assert parse_cpu_max("garbage") is None


def test_cfs_quota_in_cpus_and_unlimited() -> None:
    assert parse_cfs_quota("200000\n", "100000\n") == 2.0
    assert parse_cfs_quota("-1\n", "100000\n") is None


def test_usable_cores_is_the_affinity_without_a_quota() -> None:
    assert usable_cores(8, None) == CpuBudget(8, "8 CPUs in the affinity mask")


def test_a_quota_below_the_affinity_lowers_the_cores_rounded_down() -> None:
    budget = usable_cores(16, 4.5)
    assert budget.cores == 4
    assert "quota 4.5" in budget.source


def test_a_quota_above_the_affinity_changes_nothing() -> None:
    assert usable_cores(2, 8.0).cores == 2


def test_a_quota_under_one_cpu_still_gives_one_core() -> None:
    assert usable_cores(4, 0.5).cores == 1


@pytest.mark.parametrize(
    ("cores", "frontends", "instances", "threads"),
    [
        (16, 1, 2, 7),   # 16 - frontend - broker = 14, shared by 2
        (16, 2, 1, 13),  # two frontends reserve two cores
        (8, 1, 3, 2),    # 6 // 3
        (8, 1, 7, 1),    # 6 left for 7 instances: 1 each
        (2, 1, 1, 1),    # this machine: nothing left after the reserve, still 1 (never 0)
        (1, 1, 4, 1),
        (64, 1, 0, 62),  # no instance yet counts as one
    ],
)
def test_threads_per_instance(cores: int, frontends: int, instances: int,
                              threads: int) -> None:
    assert intra_op_share(CpuBudget(cores, "test"), frontends, instances).threads == threads


def test_the_reason_says_how_the_count_was_reached() -> None:
    reason = intra_op_share(CpuBudget(2, "2 CPUs in the affinity mask"), 1, 1).reason
    assert reason.startswith("2 usable cores (2 CPUs in the affinity mask) - 2 reserved")
    assert reason.endswith("1 thread each (the minimum)")


def _cgroup_file(tmp_path: Path, lines: str) -> str:
    path = tmp_path / "proc-cgroup"
    path.write_text(lines)
    return str(path)


def test_v2_quota_is_the_smallest_of_the_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    (root / "kube" / "pod").mkdir(parents=True)
    (root / "kube" / "cpu.max").write_text("300000 100000\n")
    (root / "kube" / "pod" / "cpu.max").write_text("max 100000\n")
    proc = _cgroup_file(tmp_path, "0::/kube/pod\n")
    assert read_cpu_quota(str(root), proc) == 3.0


def test_v1_quota_from_the_cpu_controller(tmp_path: Path) -> None:
    mount = tmp_path / "cg" / "cpu,cpuacct"
    (mount / "docker").mkdir(parents=True)
    (mount / "docker" / "cpu.cfs_quota_us").write_text("150000\n")
    (mount / "docker" / "cpu.cfs_period_us").write_text("100000\n")
    (mount / "cpu.cfs_quota_us").write_text("-1\n")
    (mount / "cpu.cfs_period_us").write_text("100000\n")
    proc = _cgroup_file(tmp_path, "4:memory:/docker\n3:cpu,cpuacct:/docker\n")
    assert read_cpu_quota(str(tmp_path / "cg"), proc) == 1.5


def test_a_container_that_sees_its_cgroup_as_root_reads_the_mount(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    root.mkdir()
    (root / "cpu.max").write_text("200000 100000\n")
    assert read_cpu_quota(str(root), _cgroup_file(tmp_path, "0::/\n")) == 2.0


def test_no_cgroup_information_means_no_quota(tmp_path: Path) -> None:
    assert read_cpu_quota(str(tmp_path), str(tmp_path / "missing")) is None
    assert read_cpu_quota(str(tmp_path), _cgroup_file(tmp_path, "0::/\n")) is None


# ---------------------------------------------------------------------- the broker's count


def _manager(cores: int, runtimes: list[Any], http_workers: int = 1) -> ModelManager:
    manager = ModelManager(settings_from_flags(model_repositories=["/nonexistent"],
                                               http_workers=http_workers).for_broker())
    manager.cpu_budget = CpuBudget(cores, "test")
    manager.gpu_count = 0
    manager.runtimes = lambda: runtimes  # type: ignore[method-assign]
    return manager


def _runtime(name: str, *slots: InstanceSlot) -> Any:
    return SimpleNamespace(name=name, version=1, backend="pytorch", instances=list(slots))


def test_the_broker_counts_cpu_instances_once_each_and_models_still_reading() -> None:
    a = _runtime("a", InstanceSlot("a_0", "CPU", 0), InstanceSlot("a_1", "CPU", 0))
    reload_of_a = _runtime("a", InstanceSlot("a_0", "CPU", 0), InstanceSlot("a_1", "CPU", 0))
    gpu = _runtime("g", InstanceSlot("g_0", "GPU", 0))
    manager = _manager(16, [a, reload_of_a, gpu])
    assert manager.cpu_instance_count() == 2
    manager.record("still_reading").busy = True
    assert manager.cpu_instance_count() == 3


def test_a_cpu_worker_gets_the_share_and_a_gpu_worker_none() -> None:
    cpu = _runtime("a", InstanceSlot("a_0", "CPU", 0), InstanceSlot("a_1", "CPU", 0))
    gpu = _runtime("g", InstanceSlot("g_0", "GPU", 0))
    manager = _manager(16, [cpu, gpu], http_workers=2)
    assert manager.intra_op_threads(cpu, cpu.instances[0]) == 6  # (16 - 3) // 2
    assert manager.intra_op_threads(gpu, gpu.instances[0]) == 0
