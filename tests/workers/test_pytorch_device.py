"""The pytorch backend with torch tensor inputs and device outputs (CUDA shared memory), as far
as a CPU can show it: the zero-copy and keep-on-device conditions need a CUDA instance."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
import torch

from shoal.errors import ShoalError
from shoal.workers.backends.base import BackendRequest, takes_device_input
from shoal.workers.backends.pytorch.backend import PytorchBackend
from shoal.workers.backends.torch_device import device_input_names, device_output_names
from shoal.workers.backends.torchscript_io import IoSpec
from tests.workers.helpers import make_request
from tests.workers.test_pytorch_backend import Twice, load, ok

TWICE_CONFIG = """
name: "twice"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


@pytest.fixture
def twice(tmp_path: pathlib.Path) -> PytorchBackend:
    return load(tmp_path, Twice(), TWICE_CONFIG)


def test_torch_and_numpy_parts_are_copied_into_one_tensor(twice: PytorchBackend) -> None:
    assert twice._workspace is not None
    twice._workspace.reset()
    parts: list[Any] = [torch.tensor([[1.0, 2.0]]),
                        np.array([[3.0, 4.0], [5.0, 6.0]], dtype=np.float32),
                        torch.tensor([[7.0, 8.0]])]
    joined = twice._assemble(parts, "FP32")
    assert joined.dtype == torch.float32
    assert joined.tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]
    assert twice._workspace.used_bytes > 0  # one copy, into the workspace


def test_bf16_parts_keep_their_bits(twice: PytorchBackend) -> None:
    bits = np.array([[0x3FC0]], dtype=np.uint16)  # 1.5 as bfloat16 bit patterns
    joined = twice._assemble([torch.tensor([[-2.0]], dtype=torch.bfloat16), bits], "BF16")
    assert joined.dtype == torch.bfloat16 and joined.tolist() == [[-2.0], [1.5]]


def test_a_single_tensor_on_the_device_is_used_as_is(twice: PytorchBackend) -> None:
    single = torch.tensor([[1.0, 2.0]])
    assert twice._assemble([single], "FP32") is single
    converted = twice._assemble([torch.tensor([[1, 2]], dtype=torch.int32)], "FP32")
    assert converted.dtype == torch.float32 and converted.tolist() == [[1.0, 2.0]]


def test_execute_takes_torch_tensor_inputs(twice: PytorchBackend) -> None:
    device_input: dict[str, Any] = {"X": torch.tensor([[1.0, 2.0]])}
    requests = [BackendRequest(0, device_input, {"X": "FP32"}, [], {}),
                make_request(1, {"X": np.array([[3.0, 4.0]], dtype=np.float32)})]
    results = twice.execute(requests)
    assert ok(results[0])["Y"].tolist() == [[2.0, 4.0]]
    assert ok(results[1])["Y"].tolist() == [[6.0, 8.0]]
    assert isinstance(ok(results[0])["Y"], np.ndarray)  # a CPU instance answers on the host


def test_only_a_cuda_instance_takes_device_inputs(twice: PytorchBackend) -> None:
    assert not takes_device_input(twice, "X")
    cuda = torch.device("cuda:0")
    names = device_input_names(cuda, [("A", "FP32"), ("S", "BYTES"), ("R", "INT32")], ["R"])
    assert names == {"A"}
    assert device_input_names(torch.device("cpu"), [("A", "FP32")], []) == frozenset()


def test_outputs_stay_on_the_device_only_when_every_request_wants_them_there() -> None:
    cuda = torch.device("cuda:0")

    def request(*names: str) -> BackendRequest:
        return BackendRequest(0, {}, {}, [], {}, device_outputs=frozenset(names))

    assert device_output_names(cuda, [request("Y", "Z"), request("Y")]) == {"Y"}
    assert device_output_names(cuda, [request("Y"), request()]) == frozenset()
    assert device_output_names(cuda, [request("Y", "S")], excluded=["S"]) == {"Y"}
    assert device_output_names(torch.device("cpu"), [request("Y")]) == frozenset()


def test_device_outputs_are_checked_and_kept_as_tensors(twice: PytorchBackend) -> None:
    spec = IoSpec("Y", "FP32", (2,), None)
    value = torch.ones(3, 2)
    kept = twice._output_array(spec, value, [], on_device=True)
    assert isinstance(kept, torch.Tensor) and kept.data_ptr() == value.data_ptr()
    with pytest.raises(ShoalError, match="model provides TYPE_INT64"):
        twice._output_array(spec, torch.ones(3, 2, dtype=torch.int64), [], on_device=True)
    with pytest.raises(ShoalError, match="scalar"):
        twice._output_array(spec, torch.tensor(1.0), [], on_device=True)
