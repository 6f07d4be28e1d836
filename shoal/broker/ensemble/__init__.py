"""Ensembles (docs/architecture.md §5): load-time validation of the step graph against the composing
models (``validate_ensemble`` -> ``EnsemblePlan``) and the per-request state machine
(``EnsembleRun``), and the admission of step calls under ``max_inflight_requests``
(``StepAdmission``). Pure: no sockets, no clock; the broker loop drives them."""

from __future__ import annotations

from shoal.broker.ensemble.admission import StepAdmission
from shoal.broker.ensemble.dependencies import (
    check_circular_dependency,
    composing_model_names,
    ensemble_load_order,
)
from shoal.broker.ensemble.metadata import ensemble_readiness, ensemble_version_info
from shoal.broker.ensemble.plan import (
    EnsemblePlan,
    EnsembleStep,
    EnsembleTensor,
    StepInput,
    validate_ensemble,
)
from shoal.broker.ensemble.run import EnsembleRun, StepCall, StepOutcome, step_request

__all__ = [
    "EnsemblePlan",
    "EnsembleRun",
    "EnsembleStep",
    "EnsembleTensor",
    "StepAdmission",
    "StepCall",
    "StepInput",
    "StepOutcome",
    "check_circular_dependency",
    "composing_model_names",
    "ensemble_load_order",
    "ensemble_readiness",
    "ensemble_version_info",
    "step_request",
    "validate_ensemble",
]
