"""PytorchBackend with ragged batching: TorchScript models that echo the tensors they received."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
import torch

from shoal.errors import ShoalError
from shoal.messages import Error
from shoal.workers.backends.base import BackendResponse
from shoal.workers.backends.pytorch.backend import PytorchBackend
from tests.workers.helpers import make_context, make_request


def spread(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` flattened into one row, repeated for every batch item (so each request sees it)."""
    return t.reshape(1, -1).expand(rows, -1).contiguous()


class EchoBatchInputs(torch.nn.Module):
    # Arguments in another order than the config: inputs are matched by forward() name.
    def forward(self, FLAT: torch.Tensor, INPUT: torch.Tensor, ITEM: torch.Tensor,
                MAX: torch.Tensor, ACC0: torch.Tensor, ACC: torch.Tensor,
                COUNT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                              torch.Tensor, torch.Tensor, torch.Tensor,
                                              torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = ITEM.size(0)
        dims = torch.tensor([ITEM.size(0), ITEM.size(1), INPUT.dim(), INPUT.size(0)],
                            dtype=torch.int32)
        return (INPUT * 2, spread(COUNT, rows), spread(ACC, rows), spread(ACC0, rows),
                torch.full((rows, 1), MAX.size(0), dtype=torch.int32), spread(ITEM, rows),
                spread(FLAT, rows), spread(dims, rows), INPUT.sum().expand(rows, 1).contiguous())


ECHO_CONFIG = """
name: "echo"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [
  { name: "ECHO" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "COUNT_OUT" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "ACC_OUT" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "ACC0_OUT" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "MAX_OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "ITEM_OUT" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "FLAT_OUT" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "DIMS_OUT" data_type: TYPE_INT32 dims: [ 4 ] },
  { name: "SUM_OUT" data_type: TYPE_FP32 dims: [ 1 ] }
]
batch_input [
  { kind: BATCH_ELEMENT_COUNT target_name: "COUNT" data_type: TYPE_INT32 source_input: "INPUT" },
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "ACC" data_type: TYPE_FP32
    source_input: "INPUT" },
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "ACC0" data_type: TYPE_INT32
    source_input: "INPUT" },
  { kind: BATCH_MAX_ELEMENT_COUNT_AS_SHAPE target_name: "MAX" data_type: TYPE_INT32
    source_input: "INPUT" },
  { kind: BATCH_ITEM_SHAPE target_name: "ITEM" data_type: TYPE_INT32 source_input: "INPUT" },
  { kind: BATCH_ITEM_SHAPE_FLATTEN target_name: "FLAT" data_type: TYPE_FP32
    source_input: "INPUT" }
]
batch_output [ { target_name: "ECHO" kind: BATCH_SCATTER_WITH_INPUT_SHAPE
                 source_input: "INPUT" } ]
dynamic_batching { }
"""


def load(tmp_path: pathlib.Path, module: torch.nn.Module, config: str) -> PytorchBackend:
    model_dir = tmp_path / "model"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    scripted: Any = torch.jit.script(module)
    scripted.save(str(model_dir / "1" / "model.pt"))
    backend = PytorchBackend()
    backend.load(make_context(model_dir, config))
    return backend


def ok(result: BackendResponse | Error | None) -> dict[str, np.ndarray]:
    assert isinstance(result, BackendResponse), result
    return {o.name: o.array for o in result.outputs}


def ragged_requests() -> list[np.ndarray]:
    # batch 1 x 3, batch 1 x 4, batch 2 x 5: 17 elements, 4 batch items, 3 requests
    return [np.arange(3, dtype=np.float32).reshape(1, 3),
            np.arange(10, 14, dtype=np.float32).reshape(1, 4),
            np.arange(20, 30, dtype=np.float32).reshape(2, 5)]


def test_each_batch_input_kind_reaches_the_model_as_triton_builds_it(
        tmp_path: pathlib.Path) -> None:
    backend = load(tmp_path, EchoBatchInputs(), ECHO_CONFIG)
    inputs = ragged_requests()
    results = [ok(r) for r in backend.execute(
        [make_request(i, {"INPUT": x}, batch_size=x.shape[0]) for i, x in enumerate(inputs)])]
    first = results[0]
    np.testing.assert_array_equal(first["COUNT_OUT"][0], [3, 4, 10])
    np.testing.assert_array_equal(first["ACC_OUT"][0], [3, 7, 17])
    np.testing.assert_array_equal(first["ACC0_OUT"][0], [0, 3, 7, 17])
    np.testing.assert_array_equal(first["MAX_OUT"][0], [10])
    np.testing.assert_array_equal(first["ITEM_OUT"][0], [3, 4, 5, 5])
    np.testing.assert_array_equal(first["FLAT_OUT"][0], [3, 4, 5, 5])
    # ITEM is [4 items, 1 dim]; INPUT is 1-D with all 17 elements concatenated
    np.testing.assert_array_equal(first["DIMS_OUT"][0], [4, 1, 1, 17])
    total = sum(float(x.sum()) for x in inputs)
    for x, result in zip(inputs, results, strict=True):
        assert result["COUNT_OUT"].shape[0] == x.shape[0]  # other outputs split by rows
        np.testing.assert_array_equal(result["ECHO"], x * 2)  # scattered by INPUT's shape
        np.testing.assert_allclose(result["SUM_OUT"], np.full((x.shape[0], 1), total))


class IndexedRagged(torch.nn.Module):
    def forward(self, values: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        # per-request sums from the concatenated input and the accumulated counts
        sums: list[torch.Tensor] = []
        start = 0
        for i in range(ends.size(0)):
            end = int(ends[i])
            sums.append(values[start:end].sum())
            start = end
        return torch.stack(sums).reshape(-1, 1)


INDEXED_CONFIG = """
name: "indexed"
platform: "pytorch_libtorch"
max_batch_size: 4
input [ { name: "RAGGED" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX"
                data_type: TYPE_INT32 source_input: "RAGGED" } ]
"""


def test_batch_inputs_follow_the_config_inputs_in_config_order(tmp_path: pathlib.Path) -> None:
    # forward() names match no config name: Triton's strict config ordering, batch inputs last
    backend = load(tmp_path, IndexedRagged(), INDEXED_CONFIG)
    inputs = [np.array([[1.0, 2.0]], np.float32), np.array([[10.0, 20.0, 30.0]], np.float32)]
    results = backend.execute([make_request(i, {"RAGGED": x}) for i, x in enumerate(inputs)])
    assert [ok(r)["SUM"].tolist() for r in results] == [[[3.0]], [[60.0]]]


def test_a_model_without_arguments_for_the_batch_inputs_fails_the_load(
        tmp_path: pathlib.Path) -> None:
    class One(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(-1, 1)

    with pytest.raises(ShoalError, match="configuration expects 2 inputs, model provides 1"):
        load(tmp_path, One(), INDEXED_CONFIG)


class EchoPadded(torch.nn.Module):
    def forward(self, INPUT: torch.Tensor, MASK: torch.Tensor, LENGTHS: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return INPUT, MASK, (INPUT + 1.0) * MASK.to(torch.float32) + LENGTHS.sum() * 0


PADDED_CONFIG = """
name: "padded"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "PADDED" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "MASK_OUT" data_type: TYPE_INT64 dims: [ -1 ] },
         { name: "CROPPED" data_type: TYPE_FP32 dims: [ -1 ] } ]
batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "LENGTHS" data_type: TYPE_INT32
                source_input: "INPUT" } ]
batch_output [ { target_name: "CROPPED" kind: BATCH_SCATTER_WITH_INPUT_SHAPE
                 source_input: "INPUT" } ]
parameters { key: "shoal_pad_ragged_inputs" value { string_value: "MASK" } }
"""


def test_padding_mode_gives_dense_inputs_a_mask_and_cropped_outputs(
        tmp_path: pathlib.Path) -> None:
    backend = load(tmp_path, EchoPadded(), PADDED_CONFIG)
    inputs = [np.array([[1.0, 2.0]], np.float32), np.array([[3.0, 4.0, 5.0, 6.0]], np.float32),
              np.array([[7.0, 8.0, 9.0], [10.0, 11.0, 12.0]], np.float32)]
    results = [ok(r) for r in backend.execute(
        [make_request(i, {"INPUT": x}, batch_size=x.shape[0]) for i, x in enumerate(inputs)])]
    np.testing.assert_array_equal(results[0]["PADDED"], [[1, 2, 0, 0]])
    np.testing.assert_array_equal(results[2]["PADDED"], [[7, 8, 9, 0], [10, 11, 12, 0]])
    np.testing.assert_array_equal(results[0]["MASK_OUT"], [[1, 1, 0, 0]])
    np.testing.assert_array_equal(results[1]["MASK_OUT"], [[1, 1, 1, 1]])
    for x, result in zip(inputs, results, strict=True):
        np.testing.assert_array_equal(result["CROPPED"], x + 1)


def test_padding_mode_on_cpu_pads_into_the_workspace(tmp_path: pathlib.Path) -> None:
    backend = load(tmp_path, EchoPadded(), PADDED_CONFIG)
    inputs = [np.ones((1, 2), np.float32), np.ones((1, 5), np.float32)]
    backend.execute([make_request(i, {"INPUT": x}) for i, x in enumerate(inputs)])
    assert backend._workspace is not None
    assert backend._workspace.used_bytes >= 2 * 5 * 4
    assert backend._workspace.fallback_allocations == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_batch_inputs_and_ragged_inputs_are_assembled_on_cuda(tmp_path: pathlib.Path) -> None:
    model_dir = tmp_path / "model"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    scripted: Any = torch.jit.script(EchoBatchInputs())
    scripted.save(str(model_dir / "1" / "model.pt"))
    backend = PytorchBackend()
    backend.load(make_context(model_dir, ECHO_CONFIG, kind="GPU", device="cuda:0"))
    inputs = ragged_requests()
    results = [ok(r) for r in backend.execute(
        [make_request(i, {"INPUT": x}, batch_size=x.shape[0]) for i, x in enumerate(inputs)])]
    np.testing.assert_array_equal(results[0]["ACC0_OUT"][0], [0, 3, 7, 17])
    for x, result in zip(inputs, results, strict=True):
        np.testing.assert_array_equal(result["ECHO"], x * 2)
    assert backend._workspace is not None and backend._workspace.device == "cuda:0"
    backend.unload()
