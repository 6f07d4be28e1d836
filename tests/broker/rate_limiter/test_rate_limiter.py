"""The rate limiter's pure parts: config reading, resource limits (Triton's defaults, flags and
refusals) and who executes next."""

from __future__ import annotations

import re

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from shoal.broker.rate_limiter import (
    ALL_DEVICES,
    GLOBAL,
    InstanceNeeds,
    RateLimiter,
    ResourceNeed,
    instance_needs,
    parse_resource_flag,
    resource_limits,
)
from shoal.errors import ShoalError


def needs(*resources: tuple[str, int], priority: int = 0, is_global: bool = False
          ) -> InstanceNeeds:
    return InstanceNeeds(tuple(ResourceNeed(n, c, is_global) for n, c in resources), priority)


# ------------------------------------------------------------------ config


def _config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_each_instance_gets_its_groups_resources_and_priority() -> None:
    config = _config('''name: "m" instance_group [
        { name: "a" count: 2 kind: KIND_CPU
          rate_limiter { resources [{ name: "R" global: true count: 3 }] priority: 2 } },
        { name: "b" count: 1 kind: KIND_CPU }]''')
    got = instance_needs(config)
    assert got == [InstanceNeeds((ResourceNeed("R", 3, True),), 2)] * 2 + [InstanceNeeds()]


def test_an_empty_resource_name_is_refused_naming_the_field() -> None:
    config = _config('name: "m" instance_group [{ name: "a" count: 1 kind: KIND_CPU '
                     'rate_limiter { resources [{ name: "" count: 1 }] } }]')
    with pytest.raises(ShoalError, match=r"instance_group\[0\].rate_limiter.resources\[0\].name"):
        instance_needs(config)


def test_a_resource_listed_twice_in_a_group_is_refused() -> None:
    config = _config('name: "m" instance_group [{ name: "a" count: 1 kind: KIND_CPU '
                     'rate_limiter { resources [{ name: "R" count: 1 }, { name: "R" count: 2 }] '
                     '} }]')
    with pytest.raises(ShoalError, match="resource 'R' is listed twice"):
        instance_needs(config)


@pytest.mark.parametrize(("text", "parsed"), [
    ("R1:10", ("R1", 10, ALL_DEVICES)), ("R2:5:0", ("R2", 5, 0)), ("R2:8:1", ("R2", 8, 1))])
def test_resource_flags_parse(text: str, parsed: tuple[str, int, int]) -> None:
    assert parse_resource_flag(text) == parsed


@pytest.mark.parametrize("text", ["R", ":1", "R:x", "R:1:2:3", "R:-1", "R:1:-3"])
def test_bad_resource_flags_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"<name>:<count>|integers|negative"):
        parse_resource_flag(text)


# ------------------------------------------------------------------ limits


def test_default_copies_are_the_largest_need_per_device() -> None:
    # Triton's rate_limiter.md example: A [R1: 4, R2: 4], B [R2: 5, R3: 10, R4: 5], C [R1: 1,
    # R3: 7, R4: 2] on one device -> R1: 4, R2: 5, R3: 10, R4: 5
    limits = resource_limits([(0, needs(("R1", 4), ("R2", 4))),
                              (0, needs(("R2", 5), ("R3", 10), ("R4", 5))),
                              (0, needs(("R1", 1), ("R3", 7), ("R4", 2)))], [])
    assert limits == {(0, "R1"): 4, (0, "R2"): 5, (0, "R3"): 10, (0, "R4"): 5}


def test_flags_set_copies_per_device_for_all_devices_and_globally() -> None:
    # rate_limiter.md: R1:10 R2:5:0 R2:8:1 R3:2 with R3 global
    flags = [("R1", 10, ALL_DEVICES), ("R2", 5, 0), ("R2", 8, 1), ("R3", 2, ALL_DEVICES)]
    limits = resource_limits([(0, needs(("R1", 1), ("R2", 1))), (1, needs(("R1", 1), ("R2", 1))),
                              (0, needs(("R3", 1), is_global=True))], flags)
    assert limits == {(0, "R1"): 10, (0, "R2"): 5, (1, "R1"): 10, (1, "R2"): 8,
                      (GLOBAL, "R3"): 2}


def test_a_flag_below_an_instances_need_is_refused_with_tritons_message() -> None:
    with pytest.raises(ShoalError, match='Resource count for "R" is limited to 1 which will '
                       "prevent scheduling of one or more model instances, the minimum "
                       "required count is 2"):
        resource_limits([(0, needs(("R", 2)))], [("R", 1, ALL_DEVICES)])


def test_with_flags_a_resource_no_flag_names_has_no_copies() -> None:
    with pytest.raises(ShoalError, match='"S" is limited to 0'):
        resource_limits([(0, needs(("R", 1), ("S", 1)))], [("R", 1, ALL_DEVICES)])


def test_a_resource_both_global_and_per_device_is_refused() -> None:
    with pytest.raises(ShoalError, match=re.escape(
            'Resource "R" is present as both global and device-specific resource in the model '
            "configuration.")):
        resource_limits([(0, needs(("R", 1), is_global=True)), (0, needs(("R", 1)))], [])


# ------------------------------------------------------------------ who executes


class Starts:
    """The broker's side of grant_next: which instances started, and which have work."""

    def __init__(self, idle_without_work: set[str] | None = None) -> None:
        self.started: list[str] = []
        self.without_work = idle_without_work or set()

    def __call__(self, instance: str) -> bool:
        if instance in self.without_work:
            return False
        self.started.append(instance)
        return True


def run_all(limiter: RateLimiter, starts: Starts) -> list[str]:
    while limiter.grant_next(starts):
        pass
    return starts.started


def test_two_instances_sharing_one_global_copy_never_run_together() -> None:
    shared = needs(("GPU_MEM", 1), is_global=True)
    limiter = RateLimiter()
    limiter.set_instances([(0, shared), (0, shared)])
    limiter.stage("a", 0, shared)
    limiter.stage("b", 0, shared)
    starts = Starts()
    assert run_all(limiter, starts) == ["a"]
    assert limiter.allocated(GLOBAL, "GPU_MEM") == 1
    limiter.release("a")
    assert run_all(limiter, starts) == ["a", "b"]
    limiter.release("b")
    assert limiter.allocated(GLOBAL, "GPU_MEM") == 0


def test_per_device_resources_do_not_block_other_devices() -> None:
    one = needs(("R", 1))
    limiter = RateLimiter()
    limiter.set_instances([(0, one), (1, one)])
    limiter.stage("gpu0", 0, one)
    limiter.stage("gpu1", 1, one)
    assert run_all(limiter, Starts()) == ["gpu0", "gpu1"]


def test_priority_two_gets_half_the_turns_of_priority_one() -> None:
    shared = needs(("R", 1), is_global=True)
    high, low = needs(("R", 1), is_global=True, priority=1), needs(("R", 1), is_global=True,
                                                                   priority=2)
    limiter = RateLimiter()
    limiter.set_instances([(0, shared)])
    starts = Starts()
    for _ in range(30):  # both always have work; each turn runs one of them
        limiter.stage("high", 0, high)
        limiter.stage("low", 0, low)
        assert limiter.grant_next(starts)
        limiter.release(starts.started[-1])
    assert starts.started.count("high") == 20 and starts.started.count("low") == 10


def test_the_head_waits_for_its_resources_and_nobody_passes_it() -> None:
    big, small = needs(("R", 2), is_global=True), needs(("R", 1), is_global=True)
    limiter = RateLimiter()
    limiter.set_instances([(0, big), (0, small)])
    limiter.stage("small1", 0, small)
    assert run_all(limiter, Starts()) == ["small1"]  # 1 of 2 copies taken
    limiter.stage("big", 0, big)
    limiter.stage("small2", 0, small)
    starts = Starts()
    assert run_all(limiter, starts) == []  # big is first in line and does not fit
    limiter.release("small1")
    assert run_all(limiter, starts) == ["big"]


def test_an_instance_without_work_leaves_the_queue_without_taking_resources() -> None:
    one = needs(("R", 1), is_global=True)
    limiter = RateLimiter()
    limiter.set_instances([(0, one)])
    limiter.stage("idle", 0, one)
    limiter.stage("busy", 0, one)
    assert run_all(limiter, Starts({"idle"})) == ["busy"]
    assert limiter.holds("busy") and not limiter.holds("idle")


def test_instances_without_resources_always_fit() -> None:
    limiter = RateLimiter()
    limiter.set_instances([(0, InstanceNeeds())])
    limiter.stage("a", 0, InstanceNeeds())
    limiter.stage("b", 0, InstanceNeeds())
    assert run_all(limiter, Starts()) == ["a", "b"]


def test_a_dead_worker_gives_its_resources_back() -> None:
    one = needs(("R", 1), is_global=True)
    limiter = RateLimiter()
    limiter.set_instances([(0, one)])
    limiter.stage("a", 0, one)
    run_all(limiter, Starts())
    limiter.forget("a")
    assert limiter.allocated(GLOBAL, "R") == 0 and "a" not in limiter.executions


def test_staging_twice_or_while_running_changes_nothing() -> None:
    one = needs(("R", 1), is_global=True)
    limiter = RateLimiter()
    limiter.set_instances([(0, one)])
    limiter.stage("a", 0, one)
    limiter.stage("a", 0, one)
    starts = Starts()
    assert run_all(limiter, starts) == ["a"]
    limiter.stage("a", 0, one)  # still running
    assert run_all(limiter, starts) == ["a"]


def test_a_withdrawn_and_restaged_instance_keeps_only_its_new_place() -> None:
    one = needs(("R", 1), is_global=True)
    limiter = RateLimiter()
    limiter.set_instances([(0, one)])
    limiter.stage("a", 0, one)
    limiter.stage("b", 0, one)
    assert run_all(limiter, Starts()) == ["a"]  # b waits in line for R
    limiter.release("b")   # b's worker went away while waiting (withdrawn)...
    limiter.stage("c", 0, one)
    limiter.stage("b", 0, one)  # ...and is back: now behind c
    limiter.release("a")
    starts = Starts()
    assert limiter.grant_next(starts) and starts.started == ["c"]
