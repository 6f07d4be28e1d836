"""Models for Triton backends shoal does not ship (TensorRT, DALI; TensorFlow where its extra is
not installed) fail their load with an UNSUPPORTED reason that says how to serve them here,
while the other models of the repository serve."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.conftest import serving
from tests.e2e.models import identity_model
from tests.e2e.server import ShoalServer

pytestmark = pytest.mark.e2e

# platform or backend line, the model file Triton's default name for it, and the backend
MODELS = {
    "trt_model": ('platform: "tensorrt_plan"', "model.plan", "tensorrt"),
    "dali_model": ('backend: "dali"', "model.dali", "dali"),
}
# with TensorFlow installed the tensorflow backend serves (tests/e2e/test_tensorflow.py)
if importlib.util.find_spec("tensorflow") is None:
    MODELS["tf_model"] = ('platform: "tensorflow_savedmodel"', "model.savedmodel", "tensorflow")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("not-built-in")
    identity_model(repo, "identity", "FP32")
    for name, (kind, filename, _) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / filename).write_bytes(b"not a real model")
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\n{kind}\nmax_batch_size: 0\n'
            'input [{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
            'output [{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }]\n')
    with serving(ShoalServer([str(repo)], ["--exit-on-error=false",
                                           "--strict-readiness=false"])) as srv:
        yield srv


def _index(server: ShoalServer) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        index = {e["name"]: e for e in httpx.post(f"{server.base}/v2/repository/index").json()}
        # a failed instance may be retried (state LOADING, with the reason) before it settles
        settled = all(index[n]["state"] == "UNAVAILABLE" for n in MODELS) and \
            index["identity"]["state"] == "READY"
        if settled or time.monotonic() > deadline:
            return index
        time.sleep(0.2)


def test_each_fails_its_load_saying_how_to_serve_it(server: ShoalServer,
                                                    tmp_path_factory: pytest.TempPathFactory
                                                    ) -> None:
    index = _index(server)
    for name, (_, _, backend) in MODELS.items():
        entry = index[name]
        assert entry["state"] == "UNAVAILABLE", entry
        assert f"backend '{backend}' is not installed" in entry["reason"], entry
        assert str(tmp_path_factory.getbasetemp()) not in entry["reason"]
    if "tf_model" in MODELS:
        assert "onnxruntime" in index["tf_model"]["reason"]
        assert "pip install 'shoal[tensorflow]'" in index["tf_model"]["reason"]


def test_the_other_models_serve(server: ShoalServer) -> None:
    assert _index(server)["identity"]["state"] == "READY"
    x = np.arange(4, dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(x)
    result = httpclient.InferenceServerClient(server.url).infer("identity", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
