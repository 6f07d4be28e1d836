"""Is a worker alive and making progress? (docs/architecture.md §8). Pure: the broker loop passes
the clock and kills what this names.

Two signals, independent of each other:
- **Heartbeat**: a worker's control thread sends one every second from the start of its load. A
  process that is stopped (SIGSTOP), or whose interpreter is wedged (a C call holding the GIL),
  falls silent; silence longer than the heartbeat timeout kills it. Before its first heartbeat a
  worker is still starting its interpreter: only ``START_GRACE_S`` applies; while it loads its
  model, the timeout is at least ``LOADING_TIMEOUT_S`` (imports and weight loading may hold the
  GIL for seconds).
- **Progress**: a worker that owes answers (a batch executing, or a decoupled request still
  open) must produce one within the model's execution timeout, counted from the batch's dispatch
  or from its last response (decoupled and LLM models: a per-response progress deadline). An
  endless ``execute()`` that still lets the heartbeat thread run is caught here.
"""

from __future__ import annotations

from typing import Final

from shoal.broker.pool import WorkerHandle, WorkerState

START_GRACE_S: Final = 120.0
LOADING_TIMEOUT_S: Final = 60.0


def owes_answers(handle: WorkerHandle) -> bool:
    return handle.state is WorkerState.BUSY or bool(handle.streams)


def note_progress(handle: WorkerHandle, now: float) -> None:
    """The worker was given work or answered: its progress clock restarts (stops when it owes
    nothing)."""
    handle.owes_since = now if owes_answers(handle) else None


def overdue(handle: WorkerHandle, now: float, heartbeat_timeout_s: float,
            execution_timeout_s: float) -> str | None:
    """Why ``handle`` must be killed now, or None. ``execution_timeout_s`` 0: no deadline."""
    if handle.state in (WorkerState.STOPPING, WorkerState.DEAD):
        return None
    if handle.heartbeat_at is None:
        if now - handle.started_at > START_GRACE_S:
            return f"it sent no heartbeat within {START_GRACE_S:g} s of its start"
        return None
    limit = (max(heartbeat_timeout_s, LOADING_TIMEOUT_S) if handle.state is WorkerState.LOADING
             else heartbeat_timeout_s)
    silent = now - handle.heartbeat_at
    if silent > limit:
        return (f"its heartbeat was silent for {silent:.1f} s (limit {limit:g} s): the process "
                "is stopped or wedged")
    if execution_timeout_s > 0 and handle.owes_since is not None and \
            now - handle.owes_since > execution_timeout_s:
        what = "an answer" if handle.streams else "its execution to finish"
        return (f"it waited {now - handle.owes_since:.1f} s for {what}, past the execution "
                f"deadline of {execution_timeout_s:g} s (shoal_execution_timeout_secs)")
    return None


class HealthTimer:
    """When the loop checks its workers' health: every ``period_s``, but not right after the
    loop itself stalled for more than ``stall_s`` (its own pause is not the workers'
    silence)."""

    def __init__(self, period_s: float, stall_s: float, now: float) -> None:
        self.period_s, self.stall_s = period_s, stall_s
        self.checked_at = now

    def due(self, now: float) -> bool:
        if now - self.checked_at < self.period_s:
            return False
        stalled = now - self.checked_at > self.stall_s
        self.checked_at = now
        return not stalled
