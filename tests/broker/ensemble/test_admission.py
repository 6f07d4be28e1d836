"""StepAdmission: Triton's max_inflight_requests (per step, shared by all requests of the
ensemble, waiting instead of rejecting) plus the back-pressure rule (a producer waits while a
step reading its outputs has calls waiting)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from shoal.broker.ensemble import EnsemblePlan, StepAdmission, validate_ensemble
from shoal.config.model_config import parse_config_text
from shoal.errors import ShoalError

from .helpers import DOCS_MODELS, diamond_plan, docs_ensemble, docs_plan

PRE, CLASSIFY, SEGMENT, COMBINE = 0, 1, 2, 3


def limited(plan: EnsemblePlan, limit: int) -> EnsemblePlan:
    return dataclasses.replace(plan, max_inflight_requests=limit)


def admitted(admission: StepAdmission[str]) -> list[tuple[int, int, str]]:
    return admission.admit()


# ------------------------------------------------------------------ the config field


def test_plan_reads_max_inflight_requests_from_the_config() -> None:
    config = docs_ensemble()
    config.ensemble_scheduling.max_inflight_requests = 16
    assert validate_ensemble(config, DOCS_MODELS).max_inflight_requests == 16
    assert docs_plan().max_inflight_requests == 0  # default: no limit


def test_negative_max_inflight_requests_is_refused_at_load_naming_the_field() -> None:
    text = ('name: "e"\nplatform: "ensemble"\nensemble_scheduling {\n'
            '  max_inflight_requests: -1\n}\n')
    with pytest.raises(ShoalError) as exc:
        parse_config_text(text, "e/config.pbtxt")
    assert "e/config.pbtxt: line 4" in exc.value.message
    assert "max_inflight_requests: -1" in exc.value.message
    assert "out of range" in exc.value.message


# ------------------------------------------------------------------ the limit


def test_without_a_limit_every_call_is_admitted_at_once() -> None:
    admission: StepAdmission[str] = StepAdmission(docs_plan())
    for run in range(50):
        admission.enqueue(PRE, run, f"pre{run}")
    assert len(admitted(admission)) == 50
    assert admission.in_flight(PRE) == 50


def test_limit_bounds_each_step_across_runs_and_waiters_go_first_come_first_served() -> None:
    admission: StepAdmission[str] = StepAdmission(limited(docs_plan(), 2))
    for run in range(5):
        admission.enqueue(PRE, run, f"pre{run}")
    assert admitted(admission) == [(PRE, 0, "pre0"), (PRE, 1, "pre1")]
    assert admission.waiting(PRE) == 3
    assert admitted(admission) == []  # nothing freed, nothing new
    admission.done(PRE)
    assert admitted(admission) == [(PRE, 2, "pre2")]
    admission.done(PRE)
    admission.done(PRE)
    assert admitted(admission) == [(PRE, 3, "pre3"), (PRE, 4, "pre4")]
    assert admission.in_flight(PRE) == 2


def test_steps_have_separate_slots() -> None:
    admission: StepAdmission[str] = StepAdmission(limited(docs_plan(), 1))
    admission.enqueue(PRE, 1, "pre1")
    admission.enqueue(CLASSIFY, 0, "cls0")
    admission.enqueue(SEGMENT, 0, "seg0")
    assert sorted(admitted(admission)) == [(PRE, 1, "pre1"), (CLASSIFY, 0, "cls0"),
                                           (SEGMENT, 0, "seg0")]


def test_done_without_a_call_in_flight_is_a_broker_bug() -> None:
    admission: StepAdmission[str] = StepAdmission(limited(docs_plan(), 1))
    with pytest.raises(ValueError, match="no call in flight"):
        admission.done(PRE)


# ------------------------------------------------------------------ back-pressure


def test_producer_waits_while_a_step_reading_its_outputs_has_a_backlog() -> None:
    admission: StepAdmission[str] = StepAdmission(limited(docs_plan(), 1))
    admission.enqueue(PRE, 0, "pre0")
    assert admitted(admission) == [(PRE, 0, "pre0")]
    admission.done(PRE)
    admission.enqueue(CLASSIFY, 0, "cls0")
    admission.enqueue(PRE, 1, "pre1")
    assert sorted(admitted(admission)) == [(PRE, 1, "pre1"), (CLASSIFY, 0, "cls0")]
    admission.done(PRE)
    admission.enqueue(CLASSIFY, 1, "cls1")  # classify is full: run 1 waits there
    admission.enqueue(PRE, 2, "pre2")
    assert admitted(admission) == []  # pre's slot is free, but its reader has a backlog
    admission.done(CLASSIFY)  # the backlog drains first, then the producer goes on
    assert admitted(admission) == [(CLASSIFY, 1, "cls1"), (PRE, 2, "pre2")]


def test_withdrawing_a_runs_waiting_calls_lets_held_producers_go_on() -> None:
    admission: StepAdmission[str] = StepAdmission(limited(docs_plan(), 1))
    admission.enqueue(CLASSIFY, 0, "cls0")
    admission.enqueue(CLASSIFY, 1, "cls1")
    admission.enqueue(SEGMENT, 1, "seg1")
    admission.enqueue(PRE, 2, "pre2")
    assert sorted(admitted(admission)) == [(CLASSIFY, 0, "cls0"), (SEGMENT, 1, "seg1")]
    assert admission.withdraw(1) == [(CLASSIFY, "cls1")]
    assert admission.waiting(CLASSIFY) == 0
    assert admitted(admission) == [(PRE, 2, "pre2")]
    assert admission.withdraw(7) == []


def test_back_pressure_reaches_back_through_the_diamond_and_drains_sinks_first() -> None:
    admission: StepAdmission[str] = StepAdmission(limited(diamond_plan(), 1))
    admission.enqueue(COMBINE, 0, "comb0")
    admission.enqueue(COMBINE, 1, "comb1")  # waits: combine is full
    admission.enqueue(SEGMENT, 2, "seg2")  # held: its reader (combine) has a backlog
    admission.enqueue(PRE, 3, "pre3")  # held: its reader (segment) has a backlog in turn
    assert admitted(admission) == [(COMBINE, 0, "comb0")]
    admission.done(COMBINE)  # one answer drains the chain in one pass, downstream first
    assert admitted(admission) == [(COMBINE, 1, "comb1"), (SEGMENT, 2, "seg2"),
                                   (PRE, 3, "pre3")]


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_random_traffic_respects_the_limit_and_always_drains(limit: int) -> None:
    """Runs of the diamond issue their steps as their inputs complete, answers come back in a
    random order: no step ever has more than ``limit`` calls in flight, and every run ends."""
    plan = limited(diamond_plan(), limit)
    rng = random.Random(limit)
    admission: StepAdmission[tuple[int, int]] = StepAdmission(plan)
    runs = 40
    done: dict[int, set[int]] = {run: set() for run in range(runs)}
    issued: list[tuple[int, int]] = []
    for run in range(runs):
        admission.enqueue(PRE, run, (run, PRE))
    for _ in range(10_000):
        for step, _run, item in admission.admit():
            assert admission.in_flight(step) <= limit
            issued.append(item)
        if not issued:
            break
        run, step = issued.pop(rng.randrange(len(issued)))
        admission.done(step)
        done[run].add(step)
        if step == PRE:
            admission.enqueue(CLASSIFY, run, (run, CLASSIFY))
            admission.enqueue(SEGMENT, run, (run, SEGMENT))
        elif step in (CLASSIFY, SEGMENT) and {CLASSIFY, SEGMENT} <= done[run]:
            admission.enqueue(COMBINE, run, (run, COMBINE))
    assert admission.idle()
    assert all(steps == {PRE, CLASSIFY, SEGMENT, COMBINE} for steps in done.values())
