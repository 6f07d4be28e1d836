"""The onnxruntime backend's config work: auto-complete from the graph by Triton's rules (the
config Triton would produce), and session options / execution providers from the config's
parameters and ``optimization`` as Triton's onnxruntime backend names them."""

from __future__ import annotations

import pathlib
import textwrap

import pytest
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.config.model_config import config_to_json
from shoal.errors import ShoalError

ort = pytest.importorskip("onnxruntime")
models = pytest.importorskip("tests.onnx_models")

from shoal.workers.backends.onnxruntime import session_setup  # noqa: E402
from shoal.workers.backends.onnxruntime.autocomplete import (  # noqa: E402
    complete_config,
    onnx_auto_complete,
)
from shoal.workers.backends.onnxruntime.graph_io import graph_tensors  # noqa: E402
from shoal.workers.backends.onnxruntime.onnx_graph import read_graph_io  # noqa: E402


def config(text: str = "") -> ModelConfig:
    return text_format.Parse(textwrap.dedent(text), ModelConfig(name="m", backend="onnxruntime"))


def completed(model: bytes, text: str = "", default_max_batch_size: int = 4) -> ModelConfig:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return complete_config(config(text), graph_tensors(session.get_inputs()),
                           graph_tensors(session.get_outputs()), default_max_batch_size)


def test_batchable_graph_gets_default_max_batch_dynamic_batching_and_its_ios() -> None:
    expected = config("""
        max_batch_size: 4
        dynamic_batching {}
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
                { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
                 { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
    """)
    assert completed(models.add_sub()) == expected


def test_graph_without_symbolic_first_dims_does_not_batch() -> None:
    expected = config("""
        input [ { name: "x" data_type: TYPE_INT32 dims: [ 2, 3 ] } ]
        output [ { name: "y" data_type: TYPE_INT64 dims: [ 3 ] } ]
    """)
    assert completed(models.fixed_shape()) == expected


def test_max_batch_size_given_is_kept_and_one_means_no_dynamic_batching() -> None:
    assert completed(models.mlp(), "max_batch_size: 16").max_batch_size == 16
    one = completed(models.mlp(), "max_batch_size: 1")
    assert one.max_batch_size == 1 and not one.HasField("dynamic_batching")
    assert completed(models.mlp(), default_max_batch_size=0).max_batch_size == 0


def test_sequence_batching_is_not_joined_by_dynamic_batching() -> None:
    done = completed(models.accumulate(), "sequence_batching {}")
    assert done.max_batch_size == 4 and not done.HasField("dynamic_batching")


def test_non_zero_max_batch_size_on_a_graph_that_cannot_batch_is_refused() -> None:
    with pytest.raises(ShoalError, match="model does not support batching while non-zero "
                                         "max_batch_size is specified"):
        completed(models.fixed_shape(), "max_batch_size: 2")


def test_partial_config_keeps_its_inputs_and_gets_the_outputs() -> None:
    done = completed(models.mlp(), 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]')
    assert [i.name for i in done.input] == ["x"] and [o.name for o in done.output] == ["y"]
    assert list(done.output[0].dims) == [3]


def test_config_with_inputs_and_outputs_is_left_alone() -> None:
    text = """
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]
    """
    assert completed(models.mlp(), text) == config(text)


def test_auto_complete_reads_a_directory_models_graph(tmp_path: pathlib.Path) -> None:
    models.write_model(tmp_path, "m", models.mlp(), as_directory=True)
    done = onnx_auto_complete(str(tmp_path / "m"), config(), 8)
    assert config_to_json(done)["max_batch_size"] == 8
    assert [(i.name, list(i.dims)) for i in done.input] == [("x", [4])]


def test_auto_complete_of_a_corrupt_file_names_the_file_not_its_path(
        tmp_path: pathlib.Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(b"\x00garbage")
    with pytest.raises(ShoalError) as failure:
        onnx_auto_complete(str(tmp_path / "m"), config(), 4)
    assert "ONNX model 'model.onnx' cannot be parsed" in failure.value.message
    assert str(tmp_path) not in failure.value.message


@pytest.mark.parametrize("build", ["add_sub", "mlp", "strings_and_half", "fixed_shape",
                                   "bf16_scale", "accumulate", "ragged_double"])
def test_graph_read_from_the_file_equals_onnxruntimes_view(tmp_path: pathlib.Path,
                                                           build: str) -> None:
    """The broker's protobuf reader sees the inputs (initializers left out), outputs, types and
    dims ONNX Runtime's session reports."""
    model = getattr(models, build)()
    path = tmp_path / "model.onnx"
    path.write_bytes(model)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert read_graph_io(str(path)) == (graph_tensors(session.get_inputs()),
                                        graph_tensors(session.get_outputs()))


# ------------------------------------------------------------------ session setup


def test_parameters_set_the_session_options() -> None:
    options = session_setup.session_options(ort, config("""
        optimization { graph { level: 1 } }
        parameters { key: "intra_op_thread_count" value { string_value: "3" } }
        parameters { key: "inter_op_thread_count" value { string_value: "2" } }
        parameters { key: "execution_mode" value { string_value: "1" } }
        parameters { key: "enable_mem_arena" value { string_value: "0" } }
        parameters { key: "enable_mem_pattern" value { string_value: "false" } }
        parameters { key: "session.intra_op.allow_spinning" value { string_value: "0" } }
    """), {})
    assert options.intra_op_num_threads == 3 and options.inter_op_num_threads == 2
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    assert not options.enable_cpu_mem_arena and not options.enable_mem_pattern
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


@pytest.mark.parametrize(("level", "expected"), [
    (-1, "ORT_ENABLE_BASIC"), (2, "ORT_DISABLE_ALL"), (0, "ORT_ENABLE_ALL")])
def test_graph_level_follows_tritons_mapping(level: int, expected: str) -> None:
    options = session_setup.session_options(
        ort, config(f"optimization {{ graph {{ level: {level} }} }}"), {})
    assert options.graph_optimization_level == getattr(ort.GraphOptimizationLevel, expected)


def test_default_threads_share_the_cpus_among_the_models_instances() -> None:
    import os

    cpus = len(os.sched_getaffinity(0))
    four = config('instance_group [ { kind: KIND_CPU count: 4 } ]')
    assert session_setup.default_intra_threads(four) == max(1, cpus // 4)
    settings = {"intra_op_thread_count": "5"}
    assert session_setup.session_options(ort, four, settings).intra_op_num_threads == 5


def test_the_thread_policy_count_applies_unless_the_model_names_one() -> None:
    four = config('instance_group [ { kind: KIND_CPU count: 4 } ]')
    assert session_setup.session_options(ort, four, {}, 3).intra_op_num_threads == 3
    named = {"intra_op_thread_count": "5"}
    assert session_setup.session_options(ort, four, named, 3).intra_op_num_threads == 5


def test_bad_execution_mode_is_refused() -> None:
    with pytest.raises(ShoalError, match="execution_mode are 0 or 1 but got 2"):
        session_setup.session_options(
            ort, config('parameters { key: "execution_mode" value { string_value: "2" } }'), {})


def test_cpu_instance_gets_the_cpu_provider() -> None:
    assert session_setup.execution_providers(ort, config(), "CPU", "cpu", 0) == [
        ("CPUExecutionProvider", {})]


def test_accelerator_missing_from_the_installed_onnxruntime_names_its_package() -> None:
    with pytest.raises(ShoalError, match=r"CUDAExecutionProvider is not available .* install "
                                         r"onnxruntime-gpu"):
        session_setup.execution_providers(ort, config(), "GPU", "cuda:0", 0)
    openvino = config('optimization { execution_accelerators { cpu_execution_accelerator '
                      '[ { name: "openvino" } ] } }')
    with pytest.raises(ShoalError, match="install onnxruntime-openvino"):
        session_setup.execution_providers(ort, openvino, "CPU", "cpu", 0)


def test_tensorrt_accelerator_maps_tritons_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ort, "get_available_providers", lambda: [
        "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    trt = config("""
        optimization { execution_accelerators { gpu_execution_accelerator [ {
          name: "tensorrt"
          parameters { key: "precision_mode" value: "FP16" }
          parameters { key: "max_workspace_size_bytes" value: "1073741824" }
          parameters { key: "trt_engine_cache_enable" value: "1" } } ] } }
    """)
    assert session_setup.execution_providers(ort, trt, "GPU", "cuda:1", 1) == [
        ("TensorrtExecutionProvider", {"device_id": "1", "trt_fp16_enable": "True",
                                       "trt_max_workspace_size": "1073741824",
                                       "trt_engine_cache_enable": "1"}),
        ("CUDAExecutionProvider", {"device_id": "1"}),
        ("CPUExecutionProvider", {})]


def test_unknown_accelerator_is_refused_as_triton_does() -> None:
    bad = config('optimization { execution_accelerators { cpu_execution_accelerator '
                 '[ { name: "magic" } ] } }')
    with pytest.raises(ShoalError, match="unknown Execution Accelerator 'magic' is requested"):
        session_setup.execution_providers(ort, bad, "CPU", "cpu", 0)


def test_example_onnx_mlp_completes_and_equals_the_torchscript_example() -> None:
    """examples/onnx_repository/mlp_onnx: auto-complete gives INPUT__0 [256] -> OUTPUT__0 [16],
    and the backend's outputs equal the TorchScript example (the same weights)."""
    import json as json_module

    import numpy as np
    import torch

    from shoal.broker.repository import load_model_source
    from shoal.workers.backends.base import InstanceContext
    from shoal.workers.backends.onnxruntime.backend import OnnxruntimeBackend
    from tests.workers.helpers import make_request

    examples = pathlib.Path(__file__).resolve().parents[2] / "examples"
    model_dir = examples / "onnx_repository" / "mlp_onnx"
    source = load_model_source(
        "mlp_onnx", str(model_dir), str(model_dir.parent), default_max_batch_size=4, gpu_count=0,
        auto_complete=lambda directory, partial: onnx_auto_complete(directory, partial, 4))
    assert [(i.name, list(i.dims)) for i in source.config.input] == [("INPUT__0", [256])]
    assert [(o.name, list(o.dims)) for o in source.config.output] == [("OUTPUT__0", [16])]
    assert source.config.max_batch_size == 32
    backend = OnnxruntimeBackend()
    backend.load(InstanceContext(
        model_name="mlp_onnx", model_version=1, model_dir=str(model_dir),
        version_dir=str(model_dir / "1"), config=source.config,
        config_json=json_module.dumps(config_to_json(source.config)),
        instance_name="mlp_onnx_0", kind="CPU", device="cpu", device_id=0))
    x = np.random.default_rng(5).standard_normal((6, 256)).astype(np.float32)
    answer = backend.execute([make_request(0, {"INPUT__0": x}, batch_size=6)])[0]
    torchscript = torch.jit.load(str(examples / "model_repository" / "mlp" / "1" / "model.pt"))
    expected = torchscript(torch.from_numpy(x)).detach().numpy()
    got = {t.name: t.array for t in answer.outputs}["OUTPUT__0"]  # type: ignore[union-attr]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_non_tensor_graph_output_is_unsupported_as_in_triton(tmp_path: pathlib.Path) -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("SequenceConstruct", ["x"], ["seq"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ShoalError, match="Unsupported ONNX Type 'seq' for I/O 'seq', expected "
                                         "'ONNX_TYPE_TENSOR'"):
        read_graph_io(str(path))
