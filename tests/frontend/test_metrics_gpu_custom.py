"""GPU gauges (NVML absent here: the absent path for real, the rendering from fake readings and
a fake NVML module), models' custom metric families, and ``--metrics-config`` parsing."""

from __future__ import annotations

import importlib
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shoal.frontend.metrics import render_prometheus
from shoal.frontend.metrics.config import DEFAULT_QUANTILES, MetricsConfig, parse_metrics_config
from shoal.frontend.metrics.gpu import GpuReading, NvmlReader
from shoal.messages import CustomMetric, CustomMetricFamily, CustomMetricKind
from shoal.process.devices import visible_gpu_count

READING = GpuReading(uuid="GPU-1234", utilization=0.25, memory_total_bytes=80 * 2**30,
                     memory_used_bytes=2**30, power_usage_w=71.5, power_limit_w=700.0,
                     energy_j=12.5)


def lines(text: str) -> set[str]:
    return set(text.splitlines())


def test_gpu_families_from_a_reading_use_triton_names_and_gpu_uuid() -> None:
    text = render_prometheus([], gpus=[READING])
    kinds = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert kinds["nv_gpu_utilization"] == "gauge"
    assert kinds["nv_energy_consumption"] == "counter"
    values = {(f.name, s.labels["gpu_uuid"]): s.value
              for f in text_string_to_metric_families(text) if f.name.startswith(("nv_gpu",
                                                                                  "nv_energy"))
              for s in f.samples}
    assert values == {("nv_gpu_utilization", "GPU-1234"): 0.25,
                      ("nv_gpu_memory_total_bytes", "GPU-1234"): 80 * 2**30,
                      ("nv_gpu_memory_used_bytes", "GPU-1234"): 2**30,
                      ("nv_gpu_power_usage", "GPU-1234"): 71.5,
                      ("nv_gpu_power_limit", "GPU-1234"): 700.0,
                      ("nv_energy_consumption", "GPU-1234"): 12.5}
    assert 'nv_energy_consumption{gpu_uuid="GPU-1234"} 12.5' in lines(text)


def test_no_gpu_no_gpu_families_and_a_missing_value_is_left_out() -> None:
    assert "nv_gpu" not in render_prometheus([])
    partial = render_prometheus([], gpus=[GpuReading(uuid="GPU-9", memory_total_bytes=1)])
    assert "nv_gpu_memory_total_bytes" in partial and "nv_gpu_power_usage" not in partial
    off = render_prometheus([], gpus=[READING], config=MetricsConfig(allow_gpu_metrics=False))
    assert "nv_gpu" not in off


def test_nvml_absent_gives_no_reader() -> None:
    """Without a GPU nvidia-ml-py is missing or finds no NVML library: both give None. On a
    machine with a GPU and nvidia-ml-py, the real reader reads it."""
    reader = NvmlReader.open(None)
    if visible_gpu_count(environ={}) == 0:  # the driver lists no GPU (fakes ignored)
        assert reader is None
    elif reader is not None:
        readings = reader.read()
        assert readings and all(r.uuid.startswith("GPU-") for r in readings)
        assert all(r.memory_total_bytes for r in readings)
        reader.close()

    def missing(name: str) -> ModuleType:
        raise ImportError(name)

    assert NvmlReader.open(None, import_module=missing) is None


class _NvmlError(Exception):
    pass


def _fake_nvml(uuids: list[str], power: bool = True) -> ModuleType:
    nvml: Any = ModuleType("pynvml")
    energy = {uuid: 1000.0 for uuid in uuids}

    def not_supported(*_: object) -> None:
        raise _NvmlError("Not Supported")

    def total_energy(handle: str) -> float:
        energy[handle] += 2500.0  # mJ per call
        return energy[handle]

    nvml.nvmlInit = lambda: None
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: len(uuids)
    nvml.nvmlDeviceGetHandleByIndex = lambda index: uuids[index]
    nvml.nvmlDeviceGetUUID = lambda handle: handle.encode()
    nvml.nvmlDeviceGetUtilizationRates = lambda handle: SimpleNamespace(gpu=40, memory=5)
    nvml.nvmlDeviceGetMemoryInfo = lambda handle: SimpleNamespace(total=100, used=30, free=70)
    nvml.nvmlDeviceGetPowerUsage = (lambda handle: 150_000) if power else not_supported
    nvml.nvmlDeviceGetEnforcedPowerLimit = (lambda handle: 300_000) if power else not_supported
    nvml.nvmlDeviceGetTotalEnergyConsumption = total_energy
    return nvml


def test_nvml_reader_converts_units_and_follows_cuda_visible_devices() -> None:
    nvml = _fake_nvml(["GPU-aaaa", "GPU-bbbb", "GPU-cccc"])
    reader = NvmlReader.open("2,GPU-aaaa", import_module=lambda name: nvml)
    assert reader is not None
    readings = reader.read()
    assert [r.uuid for r in readings] == ["GPU-cccc", "GPU-aaaa"]
    first = readings[0]
    assert (first.utilization, first.memory_total_bytes, first.memory_used_bytes) == (0.4, 100, 30)
    assert (first.power_usage_w, first.power_limit_w) == (150.0, 300.0)
    assert first.energy_j == 2.5  # joules since the reader opened
    assert NvmlReader.open("", import_module=lambda name: nvml) is None  # none visible


def test_nvml_values_a_gpu_does_not_support_are_left_out() -> None:
    reader = NvmlReader.open(None, import_module=lambda name: _fake_nvml(["GPU-x"], power=False))
    assert reader is not None
    reading = reader.read()[0]
    assert reading.power_usage_w is None and reading.utilization == 0.4


def test_nvml_init_failure_gives_no_reader() -> None:
    nvml = _fake_nvml(["GPU-x"])

    def fail() -> None:
        raise _NvmlError("Driver Not Loaded")

    nvml.nvmlInit = fail  # type: ignore[attr-defined]
    assert NvmlReader.open(None, import_module=lambda name: nvml) is None
    assert importlib.import_module("shoal.frontend.metrics.gpu")  # nothing imported pynvml eagerly


def _custom() -> list[CustomMetricFamily]:
    return [
        CustomMetricFamily("tokens_generated", "Tokens a model generated", CustomMetricKind.COUNTER,
                           [CustomMetric([("model", "llm"), ("phase", "decode")], 2023.0)]),
        CustomMetricFamily("queue_depth", "Requests waiting inside the model",
                           CustomMetricKind.GAUGE, [CustomMetric([], 7.5)]),
        CustomMetricFamily("token_latency_seconds", 'Per-token "latency"',
                           CustomMetricKind.HISTOGRAM,
                           [CustomMetric([("model", "llm")], 7.55, [0.1, 1.0, 2.5, 5.0, 10.0],
                                         [1, 0, 1, 0, 1, 0])]),
        CustomMetricFamily("nv_inference_count", "clash", CustomMetricKind.COUNTER,
                           [CustomMetric([], 1.0)]),
    ]


def test_custom_families_render_as_triton() -> None:
    text = render_prometheus([], custom=_custom())
    found = lines(text)
    assert "# TYPE tokens_generated counter" in found
    assert 'tokens_generated{model="llm",phase="decode"} 2023' in found
    assert "queue_depth 7.5" in found
    expected_buckets = {"0.1": 1, "1": 1, "2.5": 2, "5": 2, "10": 3, "+Inf": 3}
    for le, count in expected_buckets.items():
        assert f'token_latency_seconds_bucket{{le="{le}",model="llm"}} {count}.0' in found, le
    assert 'token_latency_seconds_count{model="llm"} 3.0' in found
    assert 'token_latency_seconds_sum{model="llm"} 7.55' in found
    assert "# HELP token_latency_seconds Per-token \"latency\"" in found
    kinds = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert kinds["token_latency_seconds"] == "histogram" and kinds["queue_depth"] == "gauge"


def test_a_custom_family_named_as_a_server_family_is_left_out() -> None:
    text = render_prometheus([], custom=_custom())
    assert "clash" not in text


def test_metrics_config_settings() -> None:
    assert parse_metrics_config([]) == {}
    fields = parse_metrics_config(["histogram_latencies=true", "summary_latencies=true",
                                   "counter_latencies=false",
                                   "summary_quantiles=0.5:0.05,0.99:0.001"])
    assert fields == {"metrics_histogram_latencies": True, "metrics_summary_latencies": True,
                      "metrics_counter_latencies": False,
                      "metrics_summary_quantiles": ((0.5, 0.05), (0.99, 0.001))}
    assert MetricsConfig().summary_quantiles == DEFAULT_QUANTILES


@pytest.mark.parametrize(("value", "names"), [
    ("histogram_latency=true", "histogram_latencies"),
    ("summary_latencies=maybe", "summary_latencies"),
    ("summary_quantiles=0.5", "summary_quantiles"),
    ("summary_quantiles=1.5:0.1", "summary_quantiles"),
    ("summary_latencies", "summary_latencies"),
])
def test_bad_metrics_config_names_the_setting(value: str, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        parse_metrics_config([value])
