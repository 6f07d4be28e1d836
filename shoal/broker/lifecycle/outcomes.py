"""Whether a loading generation has reached an end (docs/architecture.md §6): still loading,
ready, or failed and why. An ensemble is ready once every composing model serves and its step
graph validates against them (the plan is then set on its runtimes). Pure: reads the records.
"""

from __future__ import annotations

from collections.abc import Mapping

from shoal.broker.ensemble import validate_ensemble
from shoal.broker.lifecycle.records import Generation, ModelRecord
from shoal.errors import ShoalError


def load_outcome(generation: Generation) -> str | None:
    """None: still loading; "": ready; else why it failed."""
    reason = generation.failed_reason()
    if reason is not None:
        return reason
    return "" if generation.all_ready() else None


def ensemble_outcome(generation: Generation, records: Mapping[str, ModelRecord]) -> str | None:
    """An ensemble's ``load_outcome``: it waits for its composing models' loads, fails when one
    is not available, and is ready when its plan validates (set on its runtimes then)."""
    composing = {}
    for name in generation.dependencies:
        dependency = records.get(name)
        if dependency is not None and dependency.serving is not None:
            composing[name] = dependency.serving
        elif dependency is None or not (dependency.busy or dependency.commands):
            why = dependency.failure if dependency is not None and dependency.failure \
                else "it is not loaded"
            return f"composing model '{name}' is not available: {why}"
    if len(composing) < len(generation.dependencies):
        return None
    try:
        plan = validate_ensemble(
            generation.source.config, {n: g.source.config for n, g in composing.items()},
            loaded_versions={n: set(g.runtimes) for n, g in composing.items()})
    except ShoalError as exc:
        return exc.message
    for runtime in generation.runtimes.values():
        runtime.ensemble = plan
    return ""
