"""Ascend NPU counting through real processes, with a stand-in ``torch_npu`` (two devices) on
the server's PYTHONPATH and no NVIDIA driver: the broker counts the NPUs through the runtime,
a ``KIND_GPU`` group without ``gpus`` gets one instance per NPU, and each instance's worker maps
its device to ``npu:<id>`` and serves (the model reports the kind and device it was given)."""

from __future__ import annotations

import os
import pathlib
import textwrap

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer
from tests.workers.fake_npu import write_fake_torch_npu

# Starts torch in the broker's counting child and in two workers: slow on a loaded machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

START_TIMEOUT_S = 200.0


class _PatientServer(ShoalServer):
    def start(self, wait_ready: bool = True, timeout: float = START_TIMEOUT_S) -> ShoalServer:
        return super().start(wait_ready, timeout)


WHERE_MODEL = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.where = f"{args['model_instance_kind']}:{args['model_instance_device_id']}"

    def execute(self, requests):
        time.sleep(0.05)  # busy long enough that concurrent requests need the other instance
        where = np.array([self.where.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("WHERE", where)])
                for _ in requests]
"""

WHERE_CONFIG = """
name: "on_npu"
backend: "python"
max_batch_size: 0
input [{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }]
output [{ name: "WHERE" data_type: TYPE_STRING dims: [ 1 ] }]
instance_group [{ kind: KIND_GPU, count: 1 }]
"""


def test_a_gpu_group_gets_one_instance_per_npu(tmp_path: pathlib.Path) -> None:
    model = tmp_path / "repo" / "on_npu"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(textwrap.dedent(WHERE_CONFIG))
    (model / "1" / "model.py").write_text(textwrap.dedent(WHERE_MODEL))
    site = write_fake_torch_npu(tmp_path / "site", 2)
    path = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    server = _PatientServer([str(tmp_path / "repo")], env={"PYTHONPATH": path})
    server.env.pop("SHOAL_FAKE_GPUS", None)
    server.env.pop("SHOAL_DEVICE_INVENTORY", None)  # declared devices would hide the NPUs
    with serving(server):
        client = httpclient.InferenceServerClient(server.url, concurrency=8)
        config = client.get_model_config("on_npu")
        assert config["instance_group"][0]["kind"] == "KIND_GPU"
        assert config["instance_group"][0]["gpus"] == [0, 1]
        request = httpclient.InferInput("X", [1], "FP32")
        request.set_data_from_numpy(np.zeros(1, np.float32))
        seen: set[bytes] = set()
        for _ in range(10):
            pending = [client.async_infer("on_npu", [request]) for _ in range(8)]
            seen |= {p.get_result().as_numpy("WHERE")[0] for p in pending}
            if len(seen) == 2:
                break
        assert seen == {b"GPU:0", b"GPU:1"}
        client.close()
