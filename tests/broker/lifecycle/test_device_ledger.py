"""Device memory admission: what a model needs per device, and the pure ledger."""

from __future__ import annotations

import pathlib
import subprocess

import pytest
from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.broker.lifecycle.device_ledger import (
    DeviceHolder,
    DeviceLedger,
    DeviceUsage,
    device_instances,
    device_memory,
    device_need_parts,
    device_needs,
    discover_capacities,
    format_bytes,
    ledger_from_settings,
    model_files_bytes,
)
from shoal.config.model_config import normalize_config, parse_config_text
from shoal.errors import ErrorCode, ShoalError
from shoal.messages import DeviceMemory, DeviceMemoryHolder
from shoal.settings import settings_from_flags
from shoal.workers.workspace import device_workspace_bytes
from tests.fakes.gpus import PROVIDER

GIB = 1 << 30
MIB = 1 << 20


def config(text: str, gpu_count: int = 2, name: str = "m") -> ModelConfig:
    parsed = parse_config_text(f'name: "{name}"\nbackend: "python"\n{text}', "m/config.pbtxt")
    return normalize_config(parsed, model_name=name, source="m/config.pbtxt", gpu_count=gpu_count)


def declared(size: str) -> str:
    return f'parameters {{ key: "shoal_device_memory_bytes" value {{ string_value: "{size}" }} }}'


def version_dir(root: pathlib.Path, version: int, nbytes: int) -> str:
    path = root / str(version)
    (path / "weights").mkdir(parents=True)
    (path / "model.py").write_bytes(b"x" * 100)
    (path / "weights" / "w.bin").write_bytes(b"\0" * (nbytes - 100))
    (path / "__pycache__").mkdir()
    (path / "__pycache__" / "model.cpython.pyc").write_bytes(b"x" * 5000)
    return str(path)


# ------------------------------------------------------------------ needs


def test_declared_size_plus_workspace_and_margin_per_instance(tmp_path: pathlib.Path) -> None:
    cfg = config('instance_group [{kind: KIND_GPU, count: 2, gpus: [0]}]\n' + declared("1GiB"))
    needs = device_needs(cfg, [str(tmp_path)], margin_bytes=10, workspace_bytes=5)
    assert needs == {0: 2 * (GIB + 5 + 10)}


@pytest.mark.parametrize(("text", "expected"), [
    ("1073741824", GIB), ("512MiB", 512 * MIB), ("1.5GiB", GIB + 512 * MIB), ("2 gib", 2 * GIB),
    ("3GB", 3_000_000_000), ("4K", 4096), ("0", 0),
])
def test_declared_sizes_accept_integers_and_suffixes(text: str, expected: int) -> None:
    cfg = config('instance_group [{kind: KIND_GPU, gpus: [1]}]\n' + declared(text))
    assert device_needs(cfg, ["/nonexistent"], 0, 0) == {1: expected}


@pytest.mark.parametrize("text", ["lots", "-1GiB", "1 PiB", "GiB", "1.5.2"])
def test_a_bad_declared_size_is_invalid_arg_naming_the_parameter(text: str) -> None:
    cfg = config('instance_group [{kind: KIND_GPU, gpus: [0]}]\n' + declared(text))
    with pytest.raises(ShoalError) as info:
        device_needs(cfg, ["/nonexistent"], 0, 0)
    assert info.value.code == ErrorCode.INVALID_ARG
    assert "shoal_device_memory_bytes" in info.value.message and text in info.value.message
    assert "'m'" in info.value.message


def test_measured_size_is_the_version_directory_files(tmp_path: pathlib.Path) -> None:
    path = version_dir(tmp_path, 1, 3 * MIB)
    assert model_files_bytes(path) == 3 * MIB  # __pycache__ skipped
    cfg = config('instance_group [{kind: KIND_GPU, gpus: [0]}]')
    assert device_needs(cfg, [path], MIB, 2 * MIB) == {0: 6 * MIB}


def test_count_times_gpus_and_several_groups(tmp_path: pathlib.Path) -> None:
    cfg = config('instance_group [{kind: KIND_GPU, count: 3, gpus: [0, 1]},\n'
                 '                {kind: KIND_GPU, count: 1, gpus: [1]},\n'
                 '                {kind: KIND_CPU, count: 4}]\n' + declared("100"))
    assert device_needs(cfg, [str(tmp_path)], 0, 0) == {0: 300, 1: 400}
    assert device_instances(cfg) == {0: 3, 1: 4}


def test_gpu_group_without_gpus_spans_every_visible_gpu(tmp_path: pathlib.Path) -> None:
    cfg = config('instance_group [{kind: KIND_GPU, count: 2}]\n' + declared("100"), gpu_count=3)
    assert device_needs(cfg, [str(tmp_path)], 0, 0) == {0: 200, 1: 200, 2: 200}


def test_cpu_and_model_kinds_without_an_accelerator_need_nothing(tmp_path: pathlib.Path) -> None:
    cpu = config('instance_group [{kind: KIND_CPU, count: 2}]', gpu_count=0)
    model = config('instance_group [{kind: KIND_MODEL}]', gpu_count=0)
    default = config("", gpu_count=0)
    for cfg in (cpu, model, default):
        assert device_needs(cfg, [str(tmp_path)], GIB, GIB) == {}
        assert device_instances(cfg) == {}


def test_model_kind_with_an_accelerator_counts_on_device_zero(tmp_path: pathlib.Path) -> None:
    cfg = config('instance_group [{kind: KIND_MODEL, count: 2}]\n' + declared("100"))
    assert device_needs(cfg, [str(tmp_path)], 0, 0, gpu_count=2) == {0: 200}


def test_versions_are_summed(tmp_path: pathlib.Path) -> None:
    v1, v2 = version_dir(tmp_path, 1, 2 * MIB), version_dir(tmp_path, 2, 5 * MIB)
    cfg = config('instance_group [{kind: KIND_GPU, count: 2, gpus: [0]}]')
    assert device_needs(cfg, [v1, v2], MIB, 0) == {0: 2 * 3 * MIB + 2 * 6 * MIB}
    assert device_instances(cfg, versions=2) == {0: 4}


def test_workspace_is_the_pytorch_pool_and_zero_for_other_backends() -> None:
    text = ('max_batch_size: 8\n'
            'input [{name: "X", data_type: TYPE_FP32, dims: [16]}]\n'
            'output [{name: "Y", data_type: TYPE_FP32, dims: [16]}]')
    python = config(text)
    pytorch = normalize_config(parse_config_text('name: "t"\nplatform: "pytorch_libtorch"\n'
                                                 + text, "t"), model_name="t", source="t")
    assert device_workspace_bytes(python, []) == 0
    assert device_workspace_bytes(pytorch, []) == 8 * 16 * 4
    assert device_workspace_bytes(pytorch, [("pytorch", "workspace-bytes", "4096")]) == 4096
    assert device_workspace_bytes(pytorch, [("onnxruntime", "workspace-bytes", "1")]) == 512


# ------------------------------------------------------------------ ledger


def test_admit_records_and_usage_reports() -> None:
    ledger = DeviceLedger({0: 4 * GIB, 1: 4 * GIB}, {1: 0.5})
    assert ledger.admit("a#1", "a", {0: GIB, 1: GIB}) is None
    assert ledger.usage() == [
        DeviceUsage(0, 4 * GIB, 4 * GIB, GIB, (DeviceHolder("a#1", "a", GIB),)),
        DeviceUsage(1, 4 * GIB, 2 * GIB, GIB, (DeviceHolder("a#1", "a", GIB),)),
    ]


def test_refusal_names_device_need_free_limit_and_holders() -> None:
    ledger = DeviceLedger({0: 4 * GIB}, {0: 0.5})
    assert ledger.admit("a#1", "a", {0: GIB + GIB // 4}) is None
    message = ledger.admit("m#1", "m", {0: GIB + GIB // 2}, instances={0: 2})
    assert message == (
        "device memory admission refused loading 'm': GPU 0 needs 1.50 GiB (2 instances) but "
        "only 0.75 GiB of its 2.00 GiB limit is free (--model-load-device-limit 0:0.5 of "
        "4.00 GiB; held: 'a' 1.25 GiB)")
    assert ledger.reserved_bytes(0) == GIB + GIB // 4


def test_refusal_without_a_limit_speaks_of_the_whole_device() -> None:
    ledger = DeviceLedger({0: 2 * GIB}, {})
    message = ledger.admit("m#1", "m", {0: 3 * GIB})
    assert message == ("device memory admission refused loading 'm': GPU 0 needs 3.00 GiB but "
                       "only 2.00 GiB of its 2.00 GiB is free (held: nothing)")


def test_two_loads_that_each_fit_do_not_fit_together() -> None:
    ledger = DeviceLedger({0: 2 * GIB}, {})
    assert ledger.admit("a#1", "a", {0: 3 * GIB // 2}) is None
    message = ledger.admit("b#1", "b", {0: 3 * GIB // 2})
    assert message is not None and "'a' 1.50 GiB" in message and "0.50 GiB" in message
    assert [h.owner for h in ledger.usage()[0].holders] == ["a#1"]  # the first is kept
    ledger.release("a#1")
    assert ledger.admit("b#1", "b", {0: 3 * GIB // 2}) is None
    assert [h.owner for h in ledger.usage()[0].holders] == ["b#1"]


def test_refusal_on_one_device_reserves_nothing_anywhere() -> None:
    ledger = DeviceLedger({0: 4 * GIB, 1: GIB}, {})
    message = ledger.admit("m#1", "m", {0: GIB, 1: 2 * GIB})
    assert message is not None and "GPU 1 needs" in message and "GPU 0" not in message
    assert ledger.reserved_bytes(0) == 0 and ledger.reserved_bytes(1) == 0


def test_every_refused_device_is_named() -> None:
    ledger = DeviceLedger({0: GIB, 1: GIB}, {})
    message = ledger.admit("m#1", "m", {0: 2 * GIB, 1: 2 * GIB})
    assert message is not None and "GPU 0 needs" in message and "; GPU 1 needs" in message


def test_fractions_bound_what_may_be_reserved() -> None:
    ledger = DeviceLedger({0: 10 * GIB}, {0: 0.25})
    assert ledger.limit_bytes(0) == 10 * GIB // 4
    assert ledger.admit("a#1", "a", {0: 10 * GIB // 4}) is None  # exactly the limit fits
    assert ledger.admit("b#1", "b", {0: 1}) is not None


def test_an_unknown_device_is_refused() -> None:
    ledger = DeviceLedger({0: GIB}, {})
    message = ledger.admit("m#1", "m", {3: 1})
    assert message == "device memory admission refused loading 'm': GPU 3 is not visible"
    assert ledger.usage()[0].holders == ()


def test_a_device_of_unknown_capacity_admits_but_records() -> None:
    ledger = DeviceLedger({0: None}, {0: 0.5})
    assert ledger.admit("a#1", "a", {0: 100 * GIB}) is None
    assert ledger.admit("b#1", "b", {0: 100 * GIB}) is None
    assert ledger.usage() == [DeviceUsage(0, None, None, 200 * GIB, (
        DeviceHolder("a#1", "a", 100 * GIB), DeviceHolder("b#1", "b", 100 * GIB)))]


def test_a_reload_holds_old_and_new_generations_at_once() -> None:
    ledger = DeviceLedger({0: 3 * GIB}, {})
    assert ledger.admit("m#1", "m", {0: GIB}) is None
    assert ledger.admit("m#2", "m", {0: GIB}) is None
    message = ledger.admit("x#1", "x", {0: 2 * GIB})
    assert message is not None and "held: 'm' 2.00 GiB" in message
    ledger.release("m#1")
    assert ledger.reserved_bytes(0) == GIB


def test_cpu_only_needs_and_release_of_an_unknown_owner_are_no_ops() -> None:
    ledger = DeviceLedger({}, {})
    assert ledger.admit("c#1", "c", {}) is None
    ledger.release("c#1")
    ledger.release("never")
    assert ledger.usage() == []


def test_an_owner_holds_one_reservation_and_limits_are_checked() -> None:
    ledger = DeviceLedger({0: GIB}, {})
    assert ledger.admit("a#1", "a", {0: 1}) is None
    with pytest.raises(ValueError, match="already holds"):
        ledger.admit("a#1", "a", {0: 1})
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        DeviceLedger({0: GIB}, {0: 1.5})


def test_format_bytes() -> None:
    assert format_bytes(3 * GIB // 4) == "0.75 GiB"
    assert format_bytes(12 * MIB) == "12.00 MiB"
    assert format_bytes(512) == "512 bytes"


# ------------------------------------------------------------------ capacities


def test_declared_gpus_give_the_capacities(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOAL_FAKE_GPUS", "0:2GiB,1:512MiB")
    env = {"SHOAL_DEVICE_INVENTORY": PROVIDER, "CUDA_VISIBLE_DEVICES": ""}
    assert discover_capacities(env, query=_no_query) == {0: 2 * GIB, 1: 512 * MIB}


def test_a_failing_inventory_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOAL_FAKE_GPUS", "0:lots")
    with pytest.raises(ShoalError, match=r"SHOAL_DEVICE_INVENTORY.*SHOAL_FAKE_GPUS"):
        discover_capacities({"SHOAL_DEVICE_INVENTORY": PROVIDER}, query=_no_query)
    with pytest.raises(ShoalError, match="SHOAL_DEVICE_INVENTORY"):
        discover_capacities({"SHOAL_DEVICE_INVENTORY": "no.such.module:x"}, query=_no_query)


SMI = "GPU-aaaa-1111, 81559\nGPU-bbbb-2222, 81559\nGPU-cccc-3333, 81559\n"


@pytest.mark.parametrize(("visible", "expected"), [
    (None, {0: 81559 * MIB, 1: 81559 * MIB, 2: 81559 * MIB}),
    ("2", {0: 81559 * MIB}), ("", {}), ("1,7,0", {0: 81559 * MIB}),
    ("GPU-cccc,0", {0: 81559 * MIB, 1: 81559 * MIB}),
    ("MIG-xyz", {}),
])
def test_nvidia_smi_sizes_follow_cuda_visible_devices(visible: str | None,
                                                      expected: dict[int, int]) -> None:
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert discover_capacities(env, query=lambda: SMI) == expected


def test_mixed_sizes_in_uncertain_order_assume_the_smallest() -> None:
    smi = "GPU-a, 81559\nGPU-b, 24576\n"
    assert discover_capacities({}, query=lambda: smi) == {0: 24576 * MIB, 1: 24576 * MIB}
    pci = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1,0"}
    assert discover_capacities(pci, query=lambda: smi) == {0: 24576 * MIB, 1: 81559 * MIB}


def test_unknown_sizes_and_failures_give_nothing() -> None:
    assert discover_capacities({}, query=lambda: "GPU-a, [N/A]\nGPU-b, 100\n") == {1: 100 * MIB}
    assert discover_capacities({}, query=lambda: "garbage") == {}

    def missing() -> str:
        raise FileNotFoundError("nvidia-smi")

    def slow() -> str:
        raise subprocess.TimeoutExpired("nvidia-smi", 5)

    assert discover_capacities({}, query=missing) == {}
    assert discover_capacities({}, query=slow) == {}


def _no_query() -> str:
    raise AssertionError("nvidia-smi must not run under SHOAL_DEVICE_INVENTORY")


def test_ledger_from_settings_uses_visible_gpus_sizes_and_limits(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_from_flags(model_repositories=["/r"],
                                   model_load_device_limits=[(0, 0.5), (5, 0.5)]).for_broker()
    monkeypatch.setenv("SHOAL_FAKE_GPUS", "0:4GiB,1:2GiB")
    ledger = ledger_from_settings(settings, environ={"SHOAL_DEVICE_INVENTORY": PROVIDER})
    assert [(u.device, u.capacity, u.limit) for u in ledger.usage()] == [
        (0, 4 * GIB, 2 * GIB), (1, 2 * GIB, 2 * GIB)]
    assert "names GPU 5, which is not visible" in caplog.text
    settings = settings_from_flags(model_repositories=["/r"],
                                   model_load_device_limits=[(0, 0.5)]).for_broker()
    unknown = ledger_from_settings(settings,
                                   device_count=1, environ={"CUDA_VISIBLE_DEVICES": ""})
    assert unknown.usage() == [DeviceUsage(0, None, None, 0, ())]
    assert "cannot be enforced" in caplog.text


# ------------------------------------------------------------------ parts (llm KV pool)


def test_parts_split_the_need_and_an_llm_instance_counts_its_kv_pool(
        tmp_path: pathlib.Path) -> None:
    cfg = config('instance_group [{kind: KIND_GPU, count: 2, gpus: [1]}]')
    parts = device_need_parts(cfg, [str(tmp_path)], margin_bytes=10, workspace_bytes=0,
                              instance_parts={"weights": 300, "kv_pool": 700})
    assert parts == {1: {"weights": 600, "kv_pool": 1400, "workspace": 0, "margin": 20}}
    assert device_needs(cfg, [str(tmp_path)], margin_bytes=10, workspace_bytes=0,
                        instance_parts={"weights": 300, "kv_pool": 700}) == {1: 2020}


def test_the_ledger_as_shown_sums_a_models_generations_by_part() -> None:
    ledger = DeviceLedger({0: 4 * GIB, 1: None}, {0: 0.5})
    ledger.admit("llm#1", "llm", {0: 30}, parts={0: {"weights": 10, "kv_pool": 20}})
    ledger.admit("llm#2", "llm", {0: 30}, parts={0: {"weights": 10, "kv_pool": 20}})  # reload
    ledger.admit("mlp#1", "mlp", {0: 5})  # no parts given: one "model" part
    assert device_memory(ledger) == [
        DeviceMemory(0, 4 * GIB, 2 * GIB, 65, [
            DeviceMemoryHolder("llm", "kv_pool", 40), DeviceMemoryHolder("llm", "weights", 20),
            DeviceMemoryHolder("mlp", "model", 5)]),
        DeviceMemory(1, -1, -1, 0, []),
    ]
    ledger.release("llm#1")
    ledger.release("llm#2")
    assert device_memory(ledger)[0].holders == [DeviceMemoryHolder("mlp", "model", 5)]
