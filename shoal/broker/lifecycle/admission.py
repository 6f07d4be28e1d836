"""Device-memory admission of a loading generation (docs/architecture.md §6): what each of its
instances will hold on each device (weights, workspace, an llm backend's KV pool, the load
margin) is reserved in the lifecycle's ``DeviceLedger``, or the load fails with the reason
(INVALID_ARG) before any worker starts. Runs on the broker loop.
"""

from __future__ import annotations

import os

from shoal.broker.lifecycle.device_ledger import DeviceLedger, device_instances, device_need_parts
from shoal.broker.lifecycle.records import Generation
from shoal.broker.models import ModelManager
from shoal.errors import ErrorCode, ShoalError
from shoal.settings import BrokerSettings
from shoal.workers.backends.catalog import builtin_backend
from shoal.workers.workspace import device_workspace_bytes


def admit(generation: Generation, models: ModelManager, ledger: DeviceLedger,
          settings: BrokerSettings) -> None:
    """Reserve the generation's device memory (``generation.ledger_owner`` names the
    reservation); raises ShoalError with the ledger's refusal when it does not fit."""
    config = generation.source.config
    version_dirs = [os.path.join(generation.source.model_dir, str(v))
                    for v in generation.runtimes]
    gpus = models.gpu_count
    parts = device_need_parts(config, version_dirs, settings.model_control.device_margin_bytes,
                              device_workspace_bytes(config, settings.backend.config),
                              gpu_count=gpus,
                              instance_parts=instance_parts(generation, models, ledger))
    needs = {device: sum(held.values()) for device, held in parts.items()}
    owner = f"{generation.name}#{generation.id}"
    refusal = ledger.admit(
        owner, generation.name, needs,
        instances=device_instances(config, len(generation.runtimes), gpu_count=gpus),
        parts=parts)
    if refusal is not None:
        raise ShoalError(ErrorCode.INVALID_ARG, refusal)
    generation.ledger_owner = owner


def instance_parts(generation: Generation, models: ModelManager, ledger: DeviceLedger
                   ) -> dict[str, int] | None:
    """What one instance holds per part, for a backend whose catalog entry knows it (the
    llm backend: checkpoint weights and KV pool, ``backends/llm/device_need.py``); None for
    the others. A pool sized by free memory takes its share of the least free device its
    instances use."""
    config = generation.source.config
    entry = builtin_backend(config.backend)
    if entry is None or entry.device_parts is None:
        return None
    devices = device_instances(config, gpu_count=models.gpu_count)
    free = [limit - ledger.reserved_bytes(device) for device in devices
            if (limit := ledger.limit_bytes(device)) is not None]
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    return entry.device_parts(parameters, generation.source.model_dir,
                              min(free) if free else None)
