"""``ensemble_scheduling.max_inflight_requests`` as a pure state machine (docs/architecture.md §5).

Triton's semantics (core ``ensemble_scheduler.cc``, ``StepInflightRequestLimiter``): one limiter
per step of the ensemble, shared by all concurrent requests of that ensemble. A step request
takes a slot of its step's limiter before it is issued to the composing model and gives it back
when the composing model's final response arrives. With every slot taken, the step waits
(blocks) until one is given back: it is never rejected and never timed out. 0 means no limit.

Triton waits by blocking the thread that would issue the step, which is the thread that has just
finished the producing step, often the producing model's own instance thread: a producer stops
producing while a step that consumes its outputs waits for a slot. An event loop cannot block a
producer half-way, so the same back-pressure is expressed as a second admission rule: a step
call is issued only when its step has a free slot *and* no step that reads the step's outputs
has calls waiting. Intermediate tensors waiting for a slow downstream step therefore stay
bounded (about ``max_inflight_requests`` per producing step) instead of piling up in the
producers' output arenas, which is what the setting is for.

No deadlock: a waiting call holds no slot; every issued step ends in exactly one answer that
gives its slot back; the steps that read nothing downstream (sinks) wait only for their own
slots, and admission runs from the sinks upstream, so every backlog drains.

Not thread-safe: the broker loop alone calls it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from shoal.broker.ensemble.plan import EnsemblePlan

Item = TypeVar("Item")


@dataclass(slots=True)
class _StepGate(Generic[Item]):
    """One step's slots: ``in_flight`` issued calls; ``waiting`` (owner, call) in FIFO order."""

    in_flight: int = 0
    waiting: deque[tuple[int, Item]] = field(default_factory=deque)


class StepAdmission(Generic[Item]):
    """The admission of one ensemble's step calls. ``Item`` is whatever the caller issues (a
    call); ``owner`` says whose it is (a run), so a failed or cancelled run's calls can be
    withdrawn. With ``max_inflight_requests`` 0 every call is admitted at once."""

    def __init__(self, plan: EnsemblePlan) -> None:
        self.plan = plan
        self.limit = plan.max_inflight_requests
        self._gates: dict[int, _StepGate[Item]] = {s.index: _StepGate() for s in plan.steps}
        self._readers: dict[int, tuple[int, ...]] = _downstream_steps(plan)
        self._sinks_first = [s.index for s in reversed(plan.steps)]

    def in_flight(self, step: int) -> int:
        return self._gates[step].in_flight

    def waiting(self, step: int) -> int:
        return len(self._gates[step].waiting)

    def enqueue(self, step: int, owner: int, item: Item) -> None:
        """A call of ``step`` is ready; ``admit`` says when it may be issued."""
        self._gates[step].waiting.append((owner, item))

    def admit(self) -> list[tuple[int, int, Item]]:
        """The calls that may be issued now, as (step, owner, item), each taking a slot of its
        step; the rest keep waiting, in arrival order per step."""
        admitted: list[tuple[int, int, Item]] = []
        for step in self._sinks_first:
            gate = self._gates[step]
            while gate.waiting and self._has_room(step, gate):
                owner, item = gate.waiting.popleft()
                gate.in_flight += 1
                admitted.append((step, owner, item))
        return admitted

    def done(self, step: int) -> None:
        """An issued call of ``step`` was answered (success, error or cancellation): its slot is
        free. Call ``admit`` next."""
        gate = self._gates[step]
        if gate.in_flight <= 0:
            raise ValueError(f"ensemble '{self.plan.name}': step {step} has no call in flight")
        gate.in_flight -= 1

    def withdraw(self, owner: int) -> list[tuple[int, Item]]:
        """Remove ``owner``'s waiting calls (its run failed or was cancelled) and return them as
        (step, item). Call ``admit`` next: producers held back by them may go on."""
        withdrawn: list[tuple[int, Item]] = []
        for step, gate in self._gates.items():
            if not any(who == owner for who, _ in gate.waiting):
                continue
            kept: deque[tuple[int, Item]] = deque()
            for who, item in gate.waiting:
                if who == owner:
                    withdrawn.append((step, item))
                else:
                    kept.append((who, item))
            gate.waiting = kept
        return withdrawn

    def idle(self) -> bool:
        """No call in flight and none waiting."""
        return all(g.in_flight == 0 and not g.waiting for g in self._gates.values())

    def _has_room(self, step: int, gate: _StepGate[Item]) -> bool:
        if self.limit <= 0:
            return True
        if gate.in_flight >= self.limit:
            return False
        return not any(self._gates[reader].waiting for reader in self._readers[step])


def _downstream_steps(plan: EnsemblePlan) -> dict[int, tuple[int, ...]]:
    """Step -> the steps that read any tensor it writes."""
    readers: dict[int, set[int]] = {step.index: set() for step in plan.steps}
    for tensor in plan.tensors.values():
        if tensor.producer is not None:
            readers[tensor.producer].update(tensor.consumers)
    return {step: tuple(sorted(steps)) for step, steps in readers.items()}
