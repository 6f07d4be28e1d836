"""Large tensors over gRPC through the real server: a request of 64 KiB or more has its raw inputs
split out of the received bytes (``grpc/wire.py``) and every answer is serialized with its
outputs appended as raw wire fields; unary and streaming calls round-trip the bytes exactly,
beside small requests (parsed whole) and several inputs in one request."""

from __future__ import annotations

import pathlib
import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from shoal.frontend.grpc.wire import SPLIT_BYTES
from tests.e2e.conftest import serving
from tests.e2e.models import _write, identity_model
from tests.e2e.server import ShoalServer

PAIR_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        # OUT_A = B, OUT_B = A: each output must come from the right raw input
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("OUT_A", pb_utils.get_input_tensor_by_name(r, "B").as_numpy()),
            pb_utils.Tensor("OUT_B", pb_utils.get_input_tensor_by_name(r, "A").as_numpy())])
            for r in requests]
"""


@pytest.fixture(scope="module")
def grpc_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo: pathlib.Path = tmp_path_factory.mktemp("repo")
    identity_model(repo, "identity_fp32_any", "FP32")
    _write(repo / "swap_pair" / "config.pbtxt", """
        name: "swap_pair"
        backend: "python"
        max_batch_size: 0
        input [{ name: "A" data_type: TYPE_UINT8 dims: [ -1 ] },
               { name: "B" data_type: TYPE_UINT8 dims: [ -1 ] }]
        output [{ name: "OUT_A" data_type: TYPE_UINT8 dims: [ -1 ] },
                { name: "OUT_B" data_type: TYPE_UINT8 dims: [ -1 ] }]
    """)
    _write(repo / "swap_pair" / "1" / "model.py", PAIR_MODEL)
    with serving(ShoalServer([str(repo)]), timeout=120) as srv:
        yield srv


def fp32_input(values: np.ndarray[Any, Any]) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return [tensor]


@pytest.mark.parametrize("elements", [4, SPLIT_BYTES // 4 + 1, 4 << 20])
def test_unary_round_trip_is_exact(grpc_server: ShoalServer, elements: int) -> None:
    values = np.random.default_rng(elements).standard_normal(elements).astype(np.float32)
    with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
        answer = client.infer("identity_fp32_any", fp32_input(values), request_id="big")
    assert answer.get_response().id == "big"
    assert np.array_equal(answer.as_numpy("OUTPUT0"), values)


def test_several_large_raw_inputs_keep_their_order(grpc_server: ShoalServer) -> None:
    a = np.full(SPLIT_BYTES * 2, 1, np.uint8)
    b = np.arange(SPLIT_BYTES * 3, dtype=np.uint32).astype(np.uint8)
    inputs = []
    for name, values in (("A", a), ("B", b)):
        tensor = grpcclient.InferInput(name, list(values.shape), "UINT8")
        tensor.set_data_from_numpy(values)
        inputs.append(tensor)
    with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
        answer = client.infer("swap_pair", inputs)
    assert np.array_equal(answer.as_numpy("OUT_A"), b)
    assert np.array_equal(answer.as_numpy("OUT_B"), a)


def test_stream_answers_large_and_small_requests_in_order(grpc_server: ShoalServer) -> None:
    arrays = [np.random.default_rng(n).standard_normal(size).astype(np.float32)
              for n, size in enumerate((1 << 20, 8, 1 << 18))]
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(grpc_server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        try:
            for n, values in enumerate(arrays):
                client.async_stream_infer("identity_fp32_any", fp32_input(values),
                                          request_id=f"s{n}")
            answers = [results.get(timeout=60) for _ in arrays]
        finally:
            client.stop_stream()
    for n, (result, error) in enumerate(answers):
        assert error is None
        assert result.get_response().id == f"s{n}"
        assert np.array_equal(result.as_numpy("OUTPUT0"), arrays[n])


def test_a_large_request_with_a_bad_input_is_refused_naming_it(grpc_server: ShoalServer) -> None:
    values = np.zeros(SPLIT_BYTES, np.float32)
    tensor = grpcclient.InferInput("NOPE", [values.size], "FP32")
    tensor.set_data_from_numpy(values)
    with (grpcclient.InferenceServerClient(grpc_server.grpc_url) as client,
          pytest.raises(grpcclient.InferenceServerException) as refused):
        client.infer("identity_fp32_any", [tensor])
    assert "NOPE" in str(refused.value)
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
