"""The rate limiter, in the broker alone (``harness.py``): two models sharing one global
resource of count 1 never execute at the same time (each stand-in execution records its start
and end), with the limiter off they do overlap, priorities share turns, and resource
configurations that could never run are refused at load. (These ran through a whole server
before; the limiter is the broker's alone.)"""

from __future__ import annotations

import itertools
import pathlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shoal.messages import (
    Batch,
    BatchResult,
    ModelVersionState,
    RepositorySnapshot,
)
from tests.broker.harness import BrokerHarness, FakeWorker, answer_all, broker

SEQUENCE_START, SEQUENCE_END = 1, 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END
SHARED = 'rate_limiter { resources [{ name: "SHARED" global: true count: 1 }] }'
LIMITED: dict[str, Any] = {
    "rate_limit": "execution_count",
    "rate_limit_resources": [(name, 1, -1) for name in ("SHARED", "TURN", "SEQ", "SOLO", "X")],
    "exit_on_error": False, "strict_readiness": False}


def config(name: str, rate_limiter: str, scheduling: str = "") -> str:
    return f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [{{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }}]
        output [{{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }}]
        instance_group [{{ kind: KIND_CPU count: 1 {rate_limiter} }}]
        {scheduling}
    """


def turn(name: str, priority: int) -> str:
    return config(name, f'rate_limiter {{ resources [{{ name: "TURN" global: true count: 1 }}] '
                        f"priority: {priority} }}")


LIMITED_MODELS = {
    "left": config("left", SHARED), "right": config("right", SHARED),
    "greedy": config("greedy", 'rate_limiter { resources [{ name: "SOLO" count: 2 }] }'),
    "favoured": turn("favoured", 1), "second": turn("second", 2),
    "seq_left": config("seq_left", 'rate_limiter { resources [{ name: "SEQ" global: true '
                                   'count: 1 }] }', "sequence_batching { }"),
    "seq_right": config("seq_right", 'rate_limiter { resources [{ name: "SEQ" global: true '
                                     'count: 1 }] }', "sequence_batching { }"),
    "nameless": config("nameless", 'rate_limiter { resources [{ name: "" count: 1 }] }'),
    "clash_global": config("clash_global",
                           'rate_limiter { resources [{ name: "X" global: true count: 1 }] }'),
    "clash_device": config("clash_device", 'rate_limiter { resources [{ name: "X" count: 1 }] }'),
}

Span = tuple[float, float]


class Recorder:
    """The stand-in workers' behaviour: each execution sleeps ``seconds`` and records its span
    under its model's name."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.spans: dict[str, list[Span]] = {}
        self._lock = threading.Lock()

    def __call__(self, worker: FakeWorker, batch: Batch) -> BatchResult:
        start = time.monotonic()
        time.sleep(self.seconds)
        with self._lock:
            self.spans.setdefault(worker.spec.model_name, []).append((start, time.monotonic()))
        return answer_all(worker, batch)


def settled(harness: BrokerHarness, names: list[str]) -> dict[str, tuple[str, str]]:
    """The models' (state, reason) once every one of ``names`` is READY or UNAVAILABLE."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        message = harness.next_message(deadline - time.monotonic())
        if isinstance(message, RepositorySnapshot):
            states = {v.name: (v.state.value, v.reason) for v in message.models}
            if all(states.get(n, ("",))[0] in (ModelVersionState.READY.value,
                                               ModelVersionState.UNAVAILABLE.value)
                   for n in names):
                return states
    raise AssertionError("the models did not settle")


@pytest.fixture(scope="module")
def recorder() -> Recorder:
    return Recorder(0.15)


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory,
            recorder: Recorder) -> Iterator[tuple[BrokerHarness, dict[str, tuple[str, str]]]]:
    with broker(tmp_path_factory.mktemp("limited"), LIMITED_MODELS, recorder,
                **LIMITED) as harness:
        yield harness, settled(harness, list(LIMITED_MODELS))


def run_concurrently(harness: BrokerHarness, models: list[str]) -> None:
    """One request per entry of ``models``, all sent at once; every answer a success. A request
    to a sequence model is a whole sequence (start and end)."""
    correlation = itertools.count(1)
    ids = []
    for model in models:
        fields = {"correlation_id": next(correlation),
                  "flags": SEQUENCE_START | SEQUENCE_END} if model.startswith("seq_") else {}
        ids.append(harness.infer(model, **fields))
    answers = harness.answers(len(ids), timeout=30)
    assert all(answers[i].error is None for i in ids), [a.error for a in answers.values()]


def overlapping(left: list[Span], right: list[Span]) -> list[tuple[Span, Span]]:
    return [(a, b) for a in left for b in right if a[0] < b[1] and b[0] < a[1]]


def test_models_sharing_one_global_copy_never_execute_together(
        limited: tuple[BrokerHarness, dict[str, tuple[str, str]]], recorder: Recorder) -> None:
    harness, _ = limited
    run_concurrently(harness, ["left", "right"] * 4)
    spans = recorder.spans
    assert len(spans["left"]) == len(spans["right"]) == 4
    assert not overlapping(spans["left"], spans["right"]), "executions overlapped"
    stats = {s.name: s for s in harness.stats().models}
    assert all(stats[m].execution_count == stats[m].success.count == 4 for m in ("left", "right"))
    # the wait for the shared copy counts as queue time, as in Triton: 8 executions of 0.15 s
    # one after another wait 0.15 x (0 + 1 + ... + 7) = 4.2 s in all (each model alone: 1.8 s)
    queued_s = sum(stats[m].queue.ns for m in ("left", "right")) / 1e9
    assert queued_s > 3.0, queued_s


def test_sequence_models_sharing_one_global_copy_never_execute_together(
        limited: tuple[BrokerHarness, dict[str, tuple[str, str]]], recorder: Recorder) -> None:
    harness, _ = limited
    run_concurrently(harness, ["seq_left", "seq_right"] * 4)
    spans = recorder.spans
    assert len(spans["seq_left"]) == len(spans["seq_right"]) == 4
    assert not overlapping(spans["seq_left"], spans["seq_right"]), "executions overlapped"


def test_without_the_limiter_the_same_models_overlap(tmp_path: pathlib.Path) -> None:
    recorder = Recorder(0.15)
    with broker(tmp_path, {"left": config("left", SHARED), "right": config("right", SHARED)},
                recorder) as harness:
        settled(harness, ["left", "right"])
        run_concurrently(harness, ["left", "right"] * 4)
    assert overlapping(recorder.spans["left"], recorder.spans["right"]), recorder.spans


def test_priority_two_gets_half_the_turns_of_priority_one(
        limited: tuple[BrokerHarness, dict[str, tuple[str, str]]], recorder: Recorder) -> None:
    """30 requests for each model queued at once, taking turns on one copy of TURN: the one
    with the fewest executions x priority goes next, so while both queues hold requests (the
    first 45 turns) favoured (1) runs twice for each run of second (2). (With equal priorities
    the ratio would be 1.)"""
    harness, _ = limited
    before = {s.name: s.execution_count for s in harness.stats().models}
    recorder.seconds = 0.05
    try:
        run_concurrently(harness, ["favoured", "second"] * 30)
    finally:
        recorder.seconds = 0.15
    after = {s.name: s.execution_count for s in harness.stats().models}
    assert {m: after[m] - before[m] for m in ("favoured", "second")} == \
           {"favoured": 30, "second": 30}
    first_turns = sorted((start, m) for m in ("favoured", "second")
                         for start, _ in recorder.spans[m])[:45]
    favoured = sum(1 for _, m in first_turns if m == "favoured")
    assert 1.5 <= favoured / (45 - favoured) <= 2.5, first_turns


def test_bad_resource_configs_are_refused_at_load(
        limited: tuple[BrokerHarness, dict[str, tuple[str, str]]]) -> None:
    _, states = limited
    assert states["left"][0] == states["right"][0] == "READY"
    assert states["greedy"][0] == "UNAVAILABLE"
    assert 'Resource count for "SOLO" is limited to 1 which will prevent scheduling of one or ' \
           "more model instances, the minimum required count is 2" in states["greedy"][1]
    assert states["nameless"][0] == "UNAVAILABLE"
    assert "instance_group[0].rate_limiter.resources[0].name must not be empty" in \
           states["nameless"][1]
    refused = [states[n] for n in ("clash_global", "clash_device") if states[n][0] == "UNAVAILABLE"]
    assert len(refused) == 1, states  # whichever loaded second
    assert 'Resource "X" is present as both global and device-specific resource' in refused[0][1]
