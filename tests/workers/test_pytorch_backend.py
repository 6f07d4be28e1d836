"""PytorchBackend: TorchScript models, Triton's input/output naming rules, batching."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
import torch

from shoal.errors import ErrorCode, ShoalError
from shoal.messages import Error
from shoal.workers.backends.base import BackendResponse
from shoal.workers.backends.pytorch.backend import PytorchBackend
from shoal.workers.backends.torchscript_io import input_positions, output_positions
from tests.workers.helpers import bytes_array, make_context, make_request


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                       torch.nn.Linear(8, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.net(x)
        return result


class AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


class Minus(torch.nn.Module):
    def forward(self, b: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return a - b


class Pick(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["LEFT"] * 10 + inputs["RIGHT"]


class Join(torch.nn.Module):
    def forward(self, words: list[str]) -> list[str]:
        return [w + "!" for w in words]


class Twice(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class Doubles(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double()


def save(module: torch.nn.Module, model_dir: pathlib.Path) -> None:
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    scripted: Any = torch.jit.script(module)
    scripted.save(str(model_dir / "1" / "model.pt"))


def load(tmp_path: pathlib.Path, module: torch.nn.Module, config: str) -> PytorchBackend:
    model_dir = tmp_path / "model"
    save(module, model_dir)
    backend = PytorchBackend()
    backend.load(make_context(model_dir, config))
    return backend


def ok(result: BackendResponse | Error) -> dict[str, np.ndarray]:
    assert isinstance(result, BackendResponse), result
    return {o.name: o.array for o in result.outputs}


MLP_CONFIG = """
name: "mlp"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


@pytest.fixture
def mlp(tmp_path: pathlib.Path) -> tuple[PytorchBackend, torch.nn.Module]:
    torch.manual_seed(0)
    module = Mlp().eval()
    return load(tmp_path, module, MLP_CONFIG), module


def reference(module: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return module(torch.from_numpy(x)).numpy()  # type: ignore[no-any-return]


def test_three_requests_of_different_batch_sizes_are_batched_and_split(
        mlp: tuple[PytorchBackend, torch.nn.Module]) -> None:
    backend, module = mlp
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((n, 4), dtype=np.float32) for n in (1, 2, 3)]
    results = backend.execute([make_request(i, {"INPUT__0": x}, batch_size=x.shape[0])
                               for i, x in enumerate(inputs)])
    for x, result in zip(inputs, results, strict=True):
        out = ok(result)["OUTPUT__0"]
        assert out.shape == (x.shape[0], 3)
        np.testing.assert_allclose(out, reference(module, x), rtol=1e-5, atol=1e-6)
    assert backend._workspace is not None and backend._workspace.fallback_allocations == 0
    assert backend._workspace.used_bytes > 0  # separate arrays: one copy into the workspace


def test_adjacent_request_slices_are_used_in_place(
        mlp: tuple[PytorchBackend, torch.nn.Module]) -> None:
    backend, module = mlp
    backend.zero_copy_min_bytes = 0  # the rows of large requests (these are 16 bytes)
    whole = np.random.default_rng(1).standard_normal((6, 4), dtype=np.float32)
    parts = [whole[0:1], whole[1:3], whole[3:6]]
    results = backend.execute([make_request(i, {"INPUT__0": p}, batch_size=p.shape[0])
                               for i, p in enumerate(parts)])
    expected = reference(module, whole)
    np.testing.assert_allclose(np.concatenate([ok(r)["OUTPUT__0"] for r in results]),
                               expected, rtol=1e-5, atol=1e-6)
    assert backend._workspace is not None and backend._workspace.used_bytes == 0


def test_small_adjacent_request_slices_are_copied_rather_than_proven_adjacent(
        mlp: tuple[PytorchBackend, torch.nn.Module]) -> None:
    backend, module = mlp
    assert backend.zero_copy_min_bytes > 16  # copying 16-byte rows is cheaper than checking
    whole = np.random.default_rng(1).standard_normal((6, 4), dtype=np.float32)
    parts = [whole[0:1], whole[1:3], whole[3:6]]
    results = backend.execute([make_request(i, {"INPUT__0": p}, batch_size=p.shape[0])
                               for i, p in enumerate(parts)])
    np.testing.assert_allclose(np.concatenate([ok(r)["OUTPUT__0"] for r in results]),
                               reference(module, whole), rtol=1e-5, atol=1e-6)
    assert backend._workspace is not None and backend._workspace.used_bytes >= whole.nbytes


def test_batch_dimension_mismatch_is_an_error_for_that_request(
        mlp: tuple[PytorchBackend, torch.nn.Module]) -> None:
    backend, _ = mlp
    good = np.zeros((2, 4), dtype=np.float32)
    results = backend.execute([make_request(0, {"INPUT__0": good}, batch_size=3),
                               make_request(1, {"INPUT__0": good}, batch_size=2)])
    assert isinstance(results[0], Error) and results[0].code == ErrorCode.INVALID_ARG
    assert ok(results[1])["OUTPUT__0"].shape == (2, 3)


ADD_SUB_INDEXED = """
name: "addsub"
platform: "pytorch_libtorch"
max_batch_size: 0
input [
  { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 2 ] }
]
output [
  { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] }
]
"""


def test_named_index_convention_maps_inputs_and_outputs_by_index(tmp_path: pathlib.Path) -> None:
    backend = load(tmp_path, AddSub(), ADD_SUB_INDEXED)
    a = np.array([5.0, 7.0], dtype=np.float32)
    b = np.array([1.0, 2.0], dtype=np.float32)
    outputs = ok(backend.execute([make_request(0, {"INPUT__0": a, "INPUT__1": b})])[0])
    np.testing.assert_array_equal(outputs["OUTPUT__0"], a + b)
    np.testing.assert_array_equal(outputs["OUTPUT__1"], a - b)


FORWARD_ARG_CONFIG = """
name: "minus"
platform: "pytorch_libtorch"
input [
  { name: "a" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "b" data_type: TYPE_FP32 dims: [ 2 ] }
]
output [ { name: "diff" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def test_forward_argument_names_map_inputs(tmp_path: pathlib.Path) -> None:
    backend = load(tmp_path, Minus(), FORWARD_ARG_CONFIG)
    a = np.array([10.0, 20.0], dtype=np.float32)
    b = np.array([1.0, 2.0], dtype=np.float32)
    outputs = ok(backend.execute([make_request(0, {"a": a, "b": b})])[0])
    np.testing.assert_array_equal(outputs["diff"], a - b)


def test_names_that_follow_no_convention_use_config_order(tmp_path: pathlib.Path) -> None:
    config = FORWARD_ARG_CONFIG.replace('"a"', '"first"').replace('"b"', '"second"')
    backend = load(tmp_path, Minus(), config)
    first = np.array([10.0, 20.0], dtype=np.float32)
    second = np.array([1.0, 2.0], dtype=np.float32)
    outputs = ok(backend.execute([make_request(0, {"first": first, "second": second})])[0])
    np.testing.assert_array_equal(outputs["diff"], second - first)  # forward(b=first, a=second)


def test_dict_input_receives_tensors_by_name(tmp_path: pathlib.Path) -> None:
    config = """
    name: "pick"
    platform: "pytorch_libtorch"
    input [ { name: "LEFT" data_type: TYPE_INT64 dims: [ 1 ] },
            { name: "RIGHT" data_type: TYPE_INT64 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT64 dims: [ 1 ] } ]
    """
    backend = load(tmp_path, Pick(), config)
    outputs = ok(backend.execute([make_request(0, {"LEFT": np.array([4]),
                                                    "RIGHT": np.array([2])})])[0])
    assert outputs["OUT"].tolist() == [42]


def test_string_lists_in_and_out(tmp_path: pathlib.Path) -> None:
    config = """
    name: "join"
    platform: "pytorch_libtorch"
    input [ { name: "WORDS" data_type: TYPE_STRING dims: [ -1 ] } ]
    output [ { name: "SHOUT" data_type: TYPE_STRING dims: [ -1 ] } ]
    """
    backend = load(tmp_path, Join(), config)
    response = backend.execute([make_request(0, {"WORDS": bytes_array([b"hi", b"yo"], (2,))})])
    assert isinstance(response[0], BackendResponse)
    (output,) = response[0].outputs
    assert output.datatype == "BYTES" and output.array.tolist() == [b"hi!", b"yo!"]


def test_bf16_inputs_and_outputs_travel_as_uint16_bit_patterns(tmp_path: pathlib.Path) -> None:
    config = """
    name: "twice"
    platform: "pytorch_libtorch"
    max_batch_size: 4
    input [ { name: "X" data_type: TYPE_BF16 dims: [ 2 ] } ]
    output [ { name: "Y" data_type: TYPE_BF16 dims: [ 2 ] } ]
    """
    backend = load(tmp_path, Twice(), config)
    values = torch.tensor([[1.5, -3.0], [0.25, 8.0]], dtype=torch.bfloat16)
    bits = values.view(torch.int16).numpy().view(np.uint16)
    requests = [make_request(i, {"X": bits[i:i + 1]}, datatypes={"X": "BF16"}) for i in range(2)]
    results = backend.execute(requests)
    for i, result in enumerate(results):
        assert isinstance(result, BackendResponse)
        (output,) = result.outputs
        assert output.datatype == "BF16" and output.array.dtype == np.uint16
        doubled = torch.from_numpy(output.array.view(np.int16)).view(torch.bfloat16)
        assert torch.equal(doubled, values[i:i + 1] * 2)


def test_output_datatype_mismatch_is_reported(tmp_path: pathlib.Path) -> None:
    config = """
    name: "doubles"
    platform: "pytorch_libtorch"
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
    """
    backend = load(tmp_path, Doubles(), config)
    (result,) = backend.execute([make_request(0, {"X": np.ones(2, dtype=np.float32)})])
    assert isinstance(result, Error)
    assert "configuration expects datatype TYPE_FP32 for output 'Y', model provides " \
           "TYPE_FP64" in result.message


def test_runtime_failure_fails_the_batch_with_the_torch_message(tmp_path: pathlib.Path) -> None:
    config = ADD_SUB_INDEXED.replace("dims: [ 2 ]", "dims: [ -1 ]")
    backend = load(tmp_path, AddSub(), config)
    request = make_request(0, {"INPUT__0": np.ones(2, dtype=np.float32),
                               "INPUT__1": np.ones(3, dtype=np.float32)})
    (result,) = backend.execute([request])
    assert isinstance(result, Error) and result.code == ErrorCode.INTERNAL
    assert result.message.startswith("PyTorch execute failure:")
    assert "size of tensor" in result.message
    assert "\n" not in result.message


def test_input_count_mismatch_fails_the_load(tmp_path: pathlib.Path) -> None:
    config = """
    name: "mlp"
    platform: "pytorch_libtorch"
    input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
            { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
    """
    with pytest.raises(ShoalError, match="configuration expects 2 inputs, model provides 1"):
        load(tmp_path, Mlp(), config)


def test_missing_model_file_fails_the_load(tmp_path: pathlib.Path) -> None:
    backend = PytorchBackend()
    with pytest.raises(ShoalError, match=r"model file 'model\.pt' not found"):
        backend.load(make_context(tmp_path / "mlp", MLP_CONFIG))


def test_intra_op_thread_count_setting_is_applied(tmp_path: pathlib.Path) -> None:
    before = torch.get_num_threads()
    try:
        model_dir = tmp_path / "mlp"
        save(Mlp(), model_dir)
        PytorchBackend().load(make_context(model_dir, MLP_CONFIG,
                                           settings={"intra-op-thread-count": "1"}))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batching_on_cuda_assembles_inputs_in_the_device_workspace(
        tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    module = Mlp().eval()
    model_dir = tmp_path / "mlp"
    save(module, model_dir)
    backend = PytorchBackend()
    backend.load(make_context(model_dir, MLP_CONFIG, kind="GPU", device="cuda:0"))
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal((n, 4), dtype=np.float32) for n in (3, 1, 2)]
    results = backend.execute([make_request(i, {"INPUT__0": x}, batch_size=x.shape[0])
                               for i, x in enumerate(inputs)])
    for x, result in zip(inputs, results, strict=True):
        np.testing.assert_allclose(ok(result)["OUTPUT__0"], reference(module, x),
                                   rtol=1e-4, atol=1e-5)
    assert backend._workspace is not None
    assert backend._workspace.device == "cuda:0"
    assert backend._workspace.fallback_allocations == 0
    assert backend._workspace.used_bytes > 0
    backend.unload()


def test_input_and_output_position_rules() -> None:
    assert input_positions(["y", "x"], ["x", "y"]) == {"y": 1, "x": 0}
    assert input_positions(["IN__1", "IN__0"], ["a", "b"]) == {"IN__1": 1, "IN__0": 0}
    assert input_positions(["p", "q"], ["a", "b"]) == {"p": 0, "q": 1}
    assert output_positions(["OUT__2", "OUT__0"]) == {"OUT__2": 2, "OUT__0": 0}
    assert output_positions(["OUT__x", "OUT__0"]) == {"OUT__x": 0, "OUT__0": 1}
