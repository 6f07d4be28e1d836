"""The test suite's fake GPUs (``tests.fakes.gpus``, declared to the server through
``SHOAL_DEVICE_INVENTORY``) through real processes: on a CPU-only machine a KIND_GPU python
model loads as a GPU instance (its ``args`` say kind GPU, device 0), runs on the CPU, and
serves over HTTP."""

from __future__ import annotations

import pathlib
import textwrap

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer
from tests.fakes.gpus import fake_gpus_env

pytestmark = pytest.mark.e2e

# Echoes X + 1 and reports the kind and device the server gave this instance.
GPU_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.where = f"{args['model_instance_kind']}:{args['model_instance_device_id']}"

    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            where = np.array([self.where.encode()], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", x + 1), pb_utils.Tensor("WHERE", where)]))
        return out
"""

GPU_CONFIG = """
name: "on_gpu"
backend: "python"
max_batch_size: 0
input [{ name: "X" data_type: TYPE_FP32 dims: [ 3 ] }]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "WHERE" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [{ kind: KIND_GPU, count: 1, gpus: [ 0 ] }]
"""


@pytest.fixture
def gpu_repo(tmp_path: pathlib.Path) -> pathlib.Path:
    model = tmp_path / "on_gpu"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(textwrap.dedent(GPU_CONFIG))
    (model / "1" / "model.py").write_text(textwrap.dedent(GPU_MODEL))
    return tmp_path


def test_a_gpu_instance_serves_on_the_cpu_under_fake_gpus(gpu_repo: pathlib.Path) -> None:
    server = ShoalServer([str(gpu_repo)], env=fake_gpus_env("0:1GiB"))
    with serving(server):
        client = httpclient.InferenceServerClient(server.url)
        config = client.get_model_config("on_gpu")
        assert config["instance_group"][0]["kind"] == "KIND_GPU"
        assert config["instance_group"][0]["gpus"] == [0]
        x = np.array([1.0, 2.0, 3.0], dtype=np.float32)
        request = httpclient.InferInput("X", [3], "FP32")
        request.set_data_from_numpy(x)
        result = client.infer("on_gpu", [request])
        np.testing.assert_array_equal(result.as_numpy("Y"), x + 1)
        assert result.as_numpy("WHERE").tolist() == [b"GPU:0"]
        client.close()
