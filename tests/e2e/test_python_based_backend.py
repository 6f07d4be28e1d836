"""A Triton-style python-based backend (``<backend-directory>/<name>/model.py``) serving models
whose config is only ``backend: "<name>"``: its ``auto_complete_config`` completes each model's
config (inputs, outputs), and ``pb_utils.get_model_dir()`` is the model's version directory,
where it reads the per-model file that tells the models apart (Triton's vLLM backend is built
this way)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

BACKEND = '''
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [2]})
        config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [2]})
        return config

    def initialize(self, args):
        with open(os.path.join(pb_utils.get_model_dir(), "scale.json")) as f:
            self.scale = json.load(f)["scale"]

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * self.scale)])
            for r in requests]
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    root = pathlib.Path(tmp_path_factory.mktemp("python_based"))
    (root / "backends" / "scaler").mkdir(parents=True)
    (root / "backends" / "scaler" / "model.py").write_text(BACKEND)
    for name, versions in (("double", {1: 2.0}), ("triple", {1: 3.0, 2: 30.0})):
        for version, scale in versions.items():
            (root / "models" / name / str(version)).mkdir(parents=True)
            (root / "models" / name / str(version) / "scale.json").write_text(
                f'{{"scale": {scale}}}')
        (root / "models" / name / "config.pbtxt").write_text(
            'backend: "scaler"\nversion_policy: { all {} }\n')
    args = [f"--backend-directory={root / 'backends'}"]
    with serving(ShoalServer([str(root / "models")], args)) as srv:
        yield srv


@pytest.mark.parametrize(("model", "version", "scale"), [
    ("double", "1", 2.0), ("triple", "1", 3.0), ("triple", "2", 30.0)])
def test_each_model_version_is_completed_and_reads_its_own_directory(
        server: ShoalServer, model: str, version: str, scale: float) -> None:
    client = httpclient.InferenceServerClient(server.url)
    config = client.get_model_config(model, version)
    assert [i["name"] for i in config["input"]] == ["X"]
    assert [o["name"] for o in config["output"]] == ["Y"]
    x = httpclient.InferInput("X", [2], "FP32")
    x.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
    result = client.infer(model, [x], model_version=version)
    np.testing.assert_array_equal(result.as_numpy("Y"), np.array([scale, 2 * scale], np.float32))
