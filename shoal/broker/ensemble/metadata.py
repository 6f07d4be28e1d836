"""What the broker publishes about an ensemble: its metadata (inputs and outputs are the
ensemble config's own; platform "ensemble"; no instances) and its readiness, which follows its
composing models (an ensemble serves only while every model its steps call has the version the
step asks for ready)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import orjson
from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.broker.ensemble.plan import ENSEMBLE_PLATFORM, LATEST_VERSION, EnsemblePlan
from shoal.config.model_config import config_to_json, tensor_specs
from shoal.messages import ModelVersionInfo, ModelVersionState


def ensemble_readiness(plan: EnsemblePlan, ready_versions: Mapping[str, Collection[int]],
                       ) -> tuple[ModelVersionState, str]:
    """(READY, "") when every step's model has the version it calls ready (-1: any version),
    else (UNAVAILABLE, the first reason, naming the composing model)."""
    for step in plan.steps:
        ready = ready_versions.get(step.model_name, ())
        if not ready:
            return (ModelVersionState.UNAVAILABLE,
                    f"composing model '{step.model_name}' has no ready version")
        if step.model_version != LATEST_VERSION and step.model_version not in ready:
            return (ModelVersionState.UNAVAILABLE,
                    f"version {step.model_version} of composing model '{step.model_name}' is "
                    "not ready")
    return ModelVersionState.READY, ""


def ensemble_version_info(config: ModelConfig, version: int, state: ModelVersionState,
                          reason: str = "") -> ModelVersionInfo:
    """The frontend's view of one ensemble version (metadata, /config JSON, readiness)."""
    inputs, outputs = tensor_specs(config)
    return ModelVersionInfo(
        name=config.name, version=version, state=state, reason=reason,
        platform=ENSEMBLE_PLATFORM, max_batch_size=int(config.max_batch_size),
        inputs=inputs, outputs=outputs, decoupled=False,
        config_json=orjson.dumps(config_to_json(config)),
        serving=state is ModelVersionState.READY)
