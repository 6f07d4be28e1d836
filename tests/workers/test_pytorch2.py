"""PytorchBackend with PyTorch 2 programs (``model.pt2`` from ``torch.export.save``) and with
TorchScript implicit sequence state (state tensors as extra forward() inputs and outputs)."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
import torch

from shoal.errors import ShoalError
from shoal.workers.backends.base import BackendResponse
from shoal.workers.backends.pytorch.backend import PytorchBackend
from shoal.workers.backends.pytorch.program import ProgramFormat, file_format
from shoal.workers.backends.pytorch.sequence_io import sequence_tensors
from tests.workers.helpers import make_context, make_request


class Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.linear(x) + bias, x.sum(dim=1, keepdim=True)


class Accumulate(torch.nn.Module):
    def forward(self, value: torch.Tensor, total: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        updated = total + value
        return updated, updated


def export_affine(path: pathlib.Path, *, dynamic: bool) -> Any:
    module = Affine().eval()
    example = (torch.randn(2, 4), torch.randn(2, 3))
    batch = torch.export.Dim("batch", max=64)
    shapes = {"x": {0: batch}, "bias": {0: batch}} if dynamic else None
    program = torch.export.export(module, example, dynamic_shapes=shapes)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))
    return module


AFFINE_CONFIG = """
name: "affine"
backend: "pytorch"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "bias" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "OUT__0" data_type: TYPE_FP32 dims: [ 3 ] },
         { name: "SUM__1" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def ok(result: Any) -> dict[str, np.ndarray]:
    assert isinstance(result, BackendResponse), result
    return {o.name: o.array for o in result.outputs}


def test_exported_program_batches_and_equals_the_module(tmp_path: pathlib.Path) -> None:
    model_dir = tmp_path / "affine"
    module = export_affine(model_dir / "1" / "model.pt2", dynamic=True)
    assert file_format(str(model_dir / "1" / "model.pt2")) is ProgramFormat.EXPORTED
    backend = PytorchBackend()
    backend.load(make_context(model_dir, AFFINE_CONFIG))  # no model.pt: model.pt2 is taken
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((n, 4), dtype=np.float32) for n in (1, 3)]
    biases = [rng.standard_normal((n, 3), dtype=np.float32) for n in (1, 3)]
    results = backend.execute([make_request(i, {"x": x, "bias": b}, batch_size=len(x))
                               for i, (x, b) in enumerate(zip(xs, biases, strict=True))])
    for result, x, b in zip(results, xs, biases, strict=True):
        with torch.no_grad():
            want, total = module(torch.from_numpy(x), torch.from_numpy(b))
        got = ok(result)
        np.testing.assert_allclose(got["OUT__0"], want.numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got["SUM__1"], total.numpy(), rtol=1e-6, atol=1e-6)


def test_static_batch_dim_is_refused_for_a_batching_model(tmp_path: pathlib.Path) -> None:
    model_dir = tmp_path / "affine"
    export_affine(model_dir / "1" / "model.pt2", dynamic=False)
    with pytest.raises(ShoalError) as caught:
        PytorchBackend().load(make_context(model_dir, AFFINE_CONFIG))
    assert "fixes dim 0 of input(s) ['x', 'bias']" in caught.value.message
    assert "dynamic_shapes" in caught.value.message


def test_static_program_serves_without_batching(tmp_path: pathlib.Path) -> None:
    model_dir = tmp_path / "affine"
    module = export_affine(model_dir / "1" / "model.pt2", dynamic=False)
    config = AFFINE_CONFIG.replace("max_batch_size: 8", "max_batch_size: 0") \
        .replace("dims: [ 4 ]", "dims: [ 2, 4 ]").replace("dims: [ 3 ]", "dims: [ 2, 3 ]") \
        .replace("dims: [ 1 ]", "dims: [ 2, 1 ]")
    backend = PytorchBackend()
    backend.load(make_context(model_dir, config))
    x = np.ones((2, 4), np.float32)
    b = np.zeros((2, 3), np.float32)
    got = ok(backend.execute([make_request(0, {"x": x, "bias": b})])[0])
    with torch.no_grad():
        want, _ = module(torch.from_numpy(x), torch.from_numpy(b))
    np.testing.assert_allclose(got["OUT__0"], want.numpy(), rtol=1e-6, atol=1e-6)


def test_corrupt_pt2_fails_the_load_clearly(tmp_path: pathlib.Path) -> None:
    model_dir = tmp_path / "affine"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.pt2").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ShoalError) as caught:
        PytorchBackend().load(make_context(model_dir, AFFINE_CONFIG))
    assert caught.value.message.startswith("model 'affine': cannot load")
    assert "'model.pt2'" in caught.value.message


STATE_CONFIG = """
name: "acc"
backend: "pytorch"
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_INT64 dims: [ 1 ] } ]
sequence_batching {
  state [ { input_name: "SUM_IN__1" output_name: "SUM_OUT__1" data_type: TYPE_INT64
            dims: [ 1 ] } ]
}
"""


def test_sequence_tensors_follow_config_then_state_order(tmp_path: pathlib.Path) -> None:
    config = make_context(tmp_path / "acc", STATE_CONFIG.replace(
        "sequence_batching {", 'sequence_batching { control_input [ { name: "START" control '
        '[ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]')).config
    tensors = sequence_tensors(config)
    assert [(s.name, s.datatype) for s in tensors.inputs] == [("START", "INT32"),
                                                               ("SUM_IN__1", "INT64")]
    assert [(s.name, s.dims) for s in tensors.state_outputs] == [("SUM_OUT__1", (1,))]


def test_torchscript_state_is_an_extra_input_and_output(tmp_path: pathlib.Path) -> None:
    model_dir = tmp_path / "acc"
    (model_dir / "1").mkdir(parents=True)
    scripted: Any = torch.jit.script(Accumulate())
    scripted.save(str(model_dir / "1" / "model.pt"))
    backend = PytorchBackend()
    backend.load(make_context(model_dir, STATE_CONFIG))
    requests = [make_request(i, {"INPUT__0": np.array([[v]], np.int64),
                                 "SUM_IN__1": np.array([[s]], np.int64)})
                for i, (v, s) in enumerate([(2, 10), (5, 0)])]
    results = [ok(r) for r in backend.execute(requests)]
    assert [int(r["OUTPUT__0"][0, 0]) for r in results] == [12, 5]
    assert [int(r["SUM_OUT__1"][0, 0]) for r in results] == [12, 5]
