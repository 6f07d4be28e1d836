"""The broker's device-memory ledger on ``/metrics`` (``StatsReply.devices``): what model loads
reserve on each GPU, by model and part, against the device's size and the share loads may take
(``--model-load-device-limit``). shoal's names (Triton has no ledger):

- ``shoal_device_memory_capacity_bytes{device}`` and ``shoal_device_memory_limit_bytes{device}``
  (absent for a GPU of unknown size)
- ``shoal_device_memory_reserved_bytes{device,model,part}``: ``part`` is ``weights``,
  ``kv_pool`` (an llm-backend model's KV cache pool), ``workspace`` or ``margin``
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.metrics_core import Metric

from shoal.messages import DeviceMemory


def device_ledger_families(devices: Sequence[DeviceMemory]) -> Iterator[Metric]:
    capacity = Metric("shoal_device_memory_capacity_bytes",
                      "Memory of each GPU the device-memory ledger admits loads on", "gauge")
    limit = Metric("shoal_device_memory_limit_bytes",
                   "Bytes of each GPU model loads may reserve (--model-load-device-limit)",
                   "gauge")
    reserved = Metric("shoal_device_memory_reserved_bytes",
                      "Bytes of each GPU reserved for a loaded model, by part (weights, kv_pool, "
                      "workspace, margin)", "gauge")
    for row in devices:
        device = str(row.device)
        if row.capacity >= 0:
            capacity.add_sample(capacity.name, {"device": device}, float(row.capacity))
        if row.limit >= 0:
            limit.add_sample(limit.name, {"device": device}, float(row.limit))
        for holder in row.holders:
            reserved.add_sample(reserved.name, {"device": device, "model": holder.model,
                                                "part": holder.part}, float(holder.nbytes))
    yield capacity
    yield limit
    yield reserved
