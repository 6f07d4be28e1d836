"""GPU gauges in Triton's names (``nv_gpu_*``, ``nv_energy_consumption``), labelled
``gpu_uuid``, read through NVML (``nvidia-ml-py``, optional: ``pip install shoal[gpu]``).

NVML is imported and initialised once, lazily, by ``NvmlReader.open``. No module, no driver
or no GPU gives None: the metrics port then has no GPU families and logs why once, at debug
level. GPUs are those CUDA_VISIBLE_DEVICES leaves visible (an index is taken in NVML's PCI bus
order, a ``GPU-`` entry as a UUID prefix). A value a GPU does not support (power on some
boards) is left out for that GPU. Readings are taken every ``--metrics-interval-ms`` by the
metrics poller, off the event loop, and a scrape renders the last one.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from prometheus_client.metrics_core import Metric

from shoal.frontend.metrics.exposition import counter_family
from shoal.process.devices import cuda_visible_entries

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuReading:
    uuid: str
    utilization: float | None = None  # 0.0 - 1.0
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    power_usage_w: float | None = None
    power_limit_w: float | None = None
    energy_j: float | None = None  # since the reader opened (Triton: since the server started)


def _visible(handles: list[tuple[str, Any]], visible: str | None) -> list[tuple[str, Any]]:
    if visible is None:
        return handles
    chosen: list[tuple[str, Any]] = []
    for entry in cuda_visible_entries(visible, len(handles)):
        if entry.isdigit():
            chosen.append(handles[int(entry)])
        else:
            chosen.extend(h for h in handles if h[0].startswith(entry))
    return chosen


class NvmlReader:
    def __init__(self, nvml: ModuleType, handles: list[tuple[str, Any]]) -> None:
        self._nvml = nvml
        self._handles = handles
        self._energy_at_open: dict[str, float] = {}
        for uuid, handle in handles:
            energy = self._optional(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
            if energy is not None:
                self._energy_at_open[uuid] = float(energy)

    @staticmethod
    def open(visible_devices: str | None,
             import_module: Callable[[str], ModuleType] = importlib.import_module
             ) -> NvmlReader | None:
        """A reader of the visible GPUs, or None (no nvidia-ml-py, no driver, no GPU)."""
        try:
            nvml = import_module("pynvml")
        except ImportError:
            logger.debug("no GPU metrics: nvidia-ml-py is not installed")
            return None
        try:
            nvml.nvmlInit()
            handles = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                handles.append((uuid.decode() if isinstance(uuid, bytes) else str(uuid), handle))
        except Exception as exc:  # NVMLError and its subclasses (library or driver missing)
            logger.debug("no GPU metrics: NVML unavailable (%s)", exc)
            return None
        chosen = _visible(handles, visible_devices)
        if not chosen:
            logger.debug("no GPU metrics: no visible GPU")
            return None
        return NvmlReader(nvml, chosen)

    def _optional(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except Exception:  # NVMLError_NotSupported and the like: the value is left out
            return None

    def read(self) -> list[GpuReading]:
        nvml = self._nvml
        readings = []
        for uuid, handle in self._handles:
            use = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
            memory = self._optional(nvml.nvmlDeviceGetMemoryInfo, handle)
            power = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)  # mW
            limit = self._optional(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)  # mW
            energy = self._optional(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)  # mJ
            start = self._energy_at_open.get(uuid)
            readings.append(GpuReading(
                uuid=uuid,
                utilization=use.gpu / 100.0 if use is not None else None,
                memory_total_bytes=int(memory.total) if memory is not None else None,
                memory_used_bytes=int(memory.used) if memory is not None else None,
                power_usage_w=power / 1000.0 if power is not None else None,
                power_limit_w=limit / 1000.0 if limit is not None else None,
                energy_j=(float(energy) - start) / 1000.0
                if energy is not None and start is not None else None))
        return readings

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:
            logger.debug("nvmlShutdown: %s", exc)


# (name, kind, help, value of a reading), Triton's names and help texts (core metrics.cc)
_GPU_FAMILIES: tuple[tuple[str, str, str, Callable[[GpuReading], float | None]], ...] = (
    ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)", lambda r: r.utilization),
    ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes",
     lambda r: r.memory_total_bytes),
    ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes",
     lambda r: r.memory_used_bytes),
    ("nv_gpu_power_usage", "gauge", "GPU power usage in watts", lambda r: r.power_usage_w),
    ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts",
     lambda r: r.power_limit_w),
    ("nv_energy_consumption", "counter",
     "GPU energy consumption in joules since the Triton Server started", lambda r: r.energy_j),
)


def gpu_families(readings: Sequence[GpuReading]) -> Iterator[Metric]:
    """The GPU families of ``readings`` (none without readings; a value a GPU lacks is left
    out)."""
    for name, kind, text, value in _GPU_FAMILIES:
        family = counter_family(name, text) if kind == "counter" else Metric(name, text, kind)
        for reading in readings:
            found = value(reading)
            if found is not None:
                family.add_sample(name, {"gpu_uuid": reading.uuid}, found)
        yield family
