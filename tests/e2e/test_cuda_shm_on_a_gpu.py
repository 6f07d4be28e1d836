"""CUDA shared memory against real device memory (skipped where torch sees no CUDA device).

tritonclient's own ``cuda_shared_memory`` utilities (they need the ``cuda-python`` package) make
the client's allocations and IPC handles; a KIND_GPU TorchScript model reads its input from the
client's allocation in place and its output is copied device to device into the other one; a
python model (host arrays) gets one copy each way. Nothing is faked here.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from tests.e2e.conftest import serving
from tests.e2e.models import identity_model
from tests.e2e.server import ShoalServer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DOUBLE_CONFIG = """
name: "double_gpu"
platform: "pytorch_libtorch"
max_batch_size: 8
input [{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] }]
output [{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] }]
instance_group [{ kind: KIND_GPU count: 1 gpus: [ 0 ] }]
"""


class _Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("gpu-repo")
    (repo / "double_gpu" / "1").mkdir(parents=True)
    (repo / "double_gpu" / "config.pbtxt").write_text(DOUBLE_CONFIG)
    torch.jit.script(_Double()).save(str(repo / "double_gpu" / "1" / "model.pt"))
    identity_model(repo, "identity_host", "FP32", dims="[ -1 ]", max_batch_size=0)
    with serving(ShoalServer([str(repo)], ["--allow-client-shm=true"])) as srv:
        yield srv


@pytest.mark.parametrize("model,factor", [("double_gpu", 2.0), ("identity_host", 1.0)])
@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_device_regions_round_trip(gpu_server: ShoalServer, model: str, factor: float,
                                   transport: str) -> None:
    cudashm = pytest.importorskip("tritonclient.utils.cuda_shared_memory")
    if transport == "http":
        import tritonclient.http as client_module
        client = client_module.InferenceServerClient(gpu_server.url)
    else:
        import tritonclient.grpc as client_module  # type: ignore[no-redef]
        client = client_module.InferenceServerClient(gpu_server.grpc_url)
    x = np.random.default_rng(0).standard_normal((2, 1 << 16)).astype(np.float32)
    if model == "identity_host":
        x = x[0]
    handles = [cudashm.create_shared_memory_region(name, x.nbytes, 0)
               for name in ("gpu-in", "gpu-out")]
    try:
        cudashm.set_shared_memory_region(handles[0], [x])
        for name, handle in zip(("gpu-in", "gpu-out"), handles, strict=True):
            client.register_cuda_shared_memory(name, cudashm.get_raw_handle(handle), 0,
                                               x.nbytes)
        names = ("INPUT__0", "OUTPUT__0") if model == "double_gpu" else ("INPUT0", "OUTPUT0")
        inp = client_module.InferInput(names[0], list(x.shape), "FP32")
        inp.set_shared_memory("gpu-in", x.nbytes)
        out = client_module.InferRequestedOutput(names[1])
        out.set_shared_memory("gpu-out", x.nbytes)
        client.infer(model, [inp], outputs=[out])
        got = cudashm.get_contents_as_numpy(handles[1], np.float32, list(x.shape))
        np.testing.assert_array_equal(got, x * factor)
    finally:
        client.unregister_cuda_shared_memory()
        for handle in handles:
            cudashm.destroy_shared_memory_region(handle)
        client.close()
