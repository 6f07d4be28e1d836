"""The pytorch backend's PyTorch 2 and implicit-state paths through the real processes: a
``model.pt2`` exported program (``platform: "torch_aoti"``) answers over HTTP and gRPC exactly
as the program does in process, dynamic batching merges its requests (batch statistics), an
AOTInductor package batches and equals the package in process, a program exported with a fixed
batch dim fails its load clearly while the others serve, and a
TorchScript accumulator with implicit state (and a START control input, as Triton passes them)
sums each sequence like Triton's."""

from __future__ import annotations

import concurrent.futures
import pathlib
import shutil
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

# A loaded two-core machine takes minutes to start torch in three workers; the tests' own
# work is a few seconds.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MODELS = ("affine", "accumulate")


class Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.linear(x) + bias, x.sum(dim=1, keepdim=True)


class Accumulate(torch.nn.Module):
    """Triton's accumulator: a START row restarts the sum, the server carries it (state)."""

    def forward(self, value: torch.Tensor, start: torch.Tensor, total: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        updated = total * (1 - start).to(total.dtype) + value
        return updated, updated


AFFINE = textwrap.dedent("""
    platform: "torch_aoti"
    max_batch_size: 8
    dynamic_batching { max_queue_delay_microseconds: 50000 }
    input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] },
            { name: "bias" data_type: TYPE_FP32 dims: [ 3 ] } ]
    output [ { name: "OUT__0" data_type: TYPE_FP32 dims: [ 3 ] },
             { name: "SUM__1" data_type: TYPE_FP32 dims: [ 1 ] } ]
    instance_group [ { kind: KIND_CPU count: 1 } ]
""")

ACCUMULATE = textwrap.dedent("""
    backend: "pytorch"
    max_batch_size: 2
    sequence_batching {
      control_input [ { name: "START__1" control [ { kind: CONTROL_SEQUENCE_START
                                                      int32_false_true: [ 0, 1 ] } ] } ]
      state [ { input_name: "SUM_IN__2" output_name: "SUM_OUT__1" data_type: TYPE_INT64
                dims: [ 1 ] } ]
    }
    input [ { name: "INPUT__0" data_type: TYPE_INT64 dims: [ 1 ] } ]
    output [ { name: "OUTPUT__0" data_type: TYPE_INT64 dims: [ 1 ] } ]
    instance_group [ { kind: KIND_CPU count: 1 } ]
""")


def _export(module: torch.nn.Module, path: pathlib.Path, dynamic: bool) -> None:
    batch = torch.export.Dim("batch", max=64)
    shapes = {"x": {0: batch}, "bias": {0: batch}} if dynamic else None
    program = torch.export.export(module, (torch.randn(2, 4), torch.randn(2, 3)),
                                  dynamic_shapes=shapes)
    path.parent.mkdir(parents=True)
    torch.export.save(program, str(path))


@pytest.fixture(scope="module")
def pt2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("pt2")
    _export(Affine().eval(), repo / "affine" / "1" / "model.pt2", dynamic=True)
    (repo / "affine" / "config.pbtxt").write_text(AFFINE)
    _export(Affine().eval(), repo / "static_batch" / "1" / "model.pt2", dynamic=False)
    (repo / "static_batch" / "config.pbtxt").write_text(AFFINE)
    (repo / "accumulate" / "1").mkdir(parents=True)
    scripted: Any = torch.jit.script(Accumulate())
    scripted.save(str(repo / "accumulate" / "1" / "model.pt"))
    (repo / "accumulate" / "config.pbtxt").write_text(ACCUMULATE)
    server = ShoalServer([str(repo)], ["--exit-on-error=false", "--strict-readiness=false"])
    with serving(server) as srv:
        deadline = time.monotonic() + 120
        pending = list(MODELS)
        while pending and time.monotonic() < deadline:
            pending = [n for n in pending
                       if httpx.get(f"{srv.base}/v2/models/{n}/ready").status_code != 200]
            time.sleep(0.2)
        assert not pending, f"models not ready: {pending}\n{srv.log()}"
        yield srv


def _affine_in_process(x: np.ndarray, bias: np.ndarray) -> tuple[Any, Any]:
    with torch.no_grad():
        out, total = Affine().eval()(torch.from_numpy(x), torch.from_numpy(bias))
    return out.numpy(), total.numpy()


def test_pt2_over_http_and_grpc_equals_the_program(pt2_server: ShoalServer) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4), dtype=np.float32)
    bias = rng.standard_normal((3, 3), dtype=np.float32)
    want_out, want_sum = _affine_in_process(x, bias)
    http_inputs = [httpclient.InferInput("x", [3, 4], "FP32"),
                   httpclient.InferInput("bias", [3, 3], "FP32")]
    grpc_inputs = [grpcclient.InferInput("x", [3, 4], "FP32"),
                   grpcclient.InferInput("bias", [3, 3], "FP32")]
    for inputs in (http_inputs, grpc_inputs):
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(bias)
    results = [httpclient.InferenceServerClient(pt2_server.url).infer("affine", http_inputs),
               grpcclient.InferenceServerClient(pt2_server.grpc_url).infer("affine",
                                                                            grpc_inputs)]
    for result in results:
        np.testing.assert_allclose(result.as_numpy("OUT__0"), want_out, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(result.as_numpy("SUM__1"), want_sum, rtol=1e-6, atol=1e-6)
    config = httpx.get(f"{pt2_server.base}/v2/models/affine/config").json()
    assert (config["platform"], config["backend"]) == ("torch_aoti", "pytorch")
    assert config["default_model_filename"] == "model.pt2"


def test_pt2_dynamic_batching_merges_concurrent_requests(pt2_server: ShoalServer) -> None:
    client = httpclient.InferenceServerClient(pt2_server.url, concurrency=16)
    before = client.get_inference_statistics("affine")["model_stats"][0]
    rows = [np.full((1, 4), i, np.float32) for i in range(16)]

    def inputs(row: np.ndarray) -> list[httpclient.InferInput]:
        pair = [httpclient.InferInput("x", [1, 4], "FP32"),
                httpclient.InferInput("bias", [1, 3], "FP32")]
        pair[0].set_data_from_numpy(row)
        pair[1].set_data_from_numpy(np.zeros((1, 3), np.float32))
        return pair

    pending = [client.async_infer("affine", inputs(row)) for row in rows]
    for row, answer in zip(rows, [p.get_result() for p in pending], strict=True):
        want_out, _ = _affine_in_process(row, np.zeros((1, 3), np.float32))
        np.testing.assert_allclose(answer.as_numpy("OUT__0"), want_out, rtol=1e-6, atol=1e-6)
    stats = client.get_inference_statistics("affine")["model_stats"][0]
    sizes = [b["batch_size"] for b in stats["batch_stats"]]
    assert max(sizes) > 1, f"no execution merged requests: {sizes}"
    assert stats["inference_count"] - before["inference_count"] == 16
    assert stats["execution_count"] - before["execution_count"] < 16


def test_static_batch_dim_fails_its_load_clearly(pt2_server: ShoalServer) -> None:
    deadline = time.monotonic() + 180
    while True:  # its worker may still be loading on a busy machine
        index = {entry["name"]: entry for entry in
                 httpx.post(f"{pt2_server.base}/v2/repository/index").json()}
        if index["static_batch"]["state"] != "LOADING" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    entry = index["static_batch"]
    assert entry["state"] == "UNAVAILABLE"
    assert "max_batch_size is 8 but the exported program fixes dim 0 of input(s) " \
           "['x', 'bias']" in entry["reason"]
    assert all(index[name]["state"] == "READY" for name in MODELS)


def test_torchscript_implicit_state_accumulates_each_sequence(pt2_server: ShoalServer) -> None:
    values = [3, 1, 4, 1, 5]

    def run(sequence: int) -> list[int]:
        client = grpcclient.InferenceServerClient(pt2_server.grpc_url)
        sums = []
        for step, value in enumerate(values):
            inp = grpcclient.InferInput("INPUT__0", [1, 1], "INT64")
            inp.set_data_from_numpy(np.array([[value * sequence]], np.int64))
            result = client.infer("accumulate", [inp], sequence_id=sequence,
                                  sequence_start=step == 0, sequence_end=step == len(values) - 1)
            sums.append(int(result.as_numpy("OUTPUT__0")[0, 0]))
        return sums

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        got = dict(zip([1, 2, 3], pool.map(run, [1, 2, 3]), strict=True))
    for sequence, sums in got.items():
        assert sums == list(np.cumsum([v * sequence for v in values])), (sequence, sums)


AOTI = AFFINE.replace('name: "x"', 'name: "x__0"').replace('name: "bias"', 'name: "bias__1"')


@pytest.fixture(scope="module")
def aoti_package(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """An AOTInductor package of Affine with a dynamic batch dim (C++ compiled here: ~20 s on a
    quiet 2-core machine with the wrapper at -O0)."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("building an AOTInductor package needs a C++ compiler")
    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(Affine().eval(), (torch.randn(2, 4), torch.randn(2, 3)),
                                  dynamic_shapes={"x": {0: batch}, "bias": {0: batch}})
    path = tmp_path_factory.mktemp("aoti") / "affine.pt2"
    torch._inductor.aoti_compile_and_package(
        program, package_path=str(path),
        inductor_configs={"aot_inductor.compile_wrapper_opt_level": "O0"})
    return path


def test_aoti_package_batches_equal_the_package_in_process(
        aoti_package: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """An AOTInductor package (no argument names: inputs map by NAME__index) served by the
    pytorch backend: concurrent requests merge into batches, and every answer equals the package
    run in process on the same rows."""
    (tmp_path / "aoti" / "1").mkdir(parents=True)
    (tmp_path / "aoti" / "1" / "model.pt2").write_bytes(aoti_package.read_bytes())
    (tmp_path / "aoti" / "config.pbtxt").write_text(AOTI)
    in_process = torch._inductor.aoti_load_package(str(aoti_package))
    rng = np.random.default_rng(5)
    rows = [(rng.standard_normal((1, 4), dtype=np.float32),
             rng.standard_normal((1, 3), dtype=np.float32)) for _ in range(8)]
    with serving(ShoalServer([str(tmp_path)])) as srv:
        client = httpclient.InferenceServerClient(srv.url, concurrency=8)

        def inputs(x: np.ndarray, bias: np.ndarray) -> list[httpclient.InferInput]:
            pair = [httpclient.InferInput("x__0", [1, 4], "FP32"),
                    httpclient.InferInput("bias__1", [1, 3], "FP32")]
            pair[0].set_data_from_numpy(x)
            pair[1].set_data_from_numpy(bias)
            return pair

        pending = [client.async_infer("aoti", inputs(x, bias)) for x, bias in rows]
        answers = [p.get_result() for p in pending]
        stats = client.get_inference_statistics("aoti")["model_stats"][0]
    for (x, bias), answer in zip(rows, answers, strict=True):
        with torch.no_grad():
            want_out, want_sum = in_process(torch.from_numpy(x), torch.from_numpy(bias))
        np.testing.assert_allclose(answer.as_numpy("OUT__0"), want_out.numpy(), rtol=1e-6,
                                   atol=1e-6)
        np.testing.assert_allclose(answer.as_numpy("SUM__1"), want_sum.numpy(), rtol=1e-6,
                                   atol=1e-6)
    sizes = [b["batch_size"] for b in stats["batch_stats"]]
    assert max(sizes) > 1, f"no execution merged requests: {sizes}"
