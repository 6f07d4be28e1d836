"""fil auto-complete through the real processes: an XGBoost classifier whose config.pbtxt gives
only the backend and the FIL parameters serves with input__0 / output__0 filled from the model
(feature count, both class probabilities), its outputs equal XGBoost's own ``predict_proba``;
a model file XGBoost cannot read fails its load naming the library's error while the other
model serves."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

xgb = pytest.importorskip("xgboost")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

FEATURES = 6
CONFIG = textwrap.dedent("""
    backend: "fil"
    instance_group [ { kind: KIND_CPU count: 1 } ]
    parameters [
      { key: "model_type" value: { string_value: "xgboost_json" } },
      { key: "output_class" value: { string_value: "true" } },
      { key: "predict_proba" value: { string_value: "true" } }
    ]
""")


@pytest.fixture(scope="module")
def classifier() -> object:
    x = np.random.default_rng(0).standard_normal((200, FEATURES)).astype(np.float32)
    return xgb.XGBClassifier(n_estimators=5, max_depth=3).fit(x, (x[:, 0] > 0).astype(int))


@pytest.fixture(scope="module")
def fil_server(tmp_path_factory: pytest.TempPathFactory,
               classifier: object) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("fil-autocomplete")
    for name in ("proba", "corrupt"):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG)
    classifier.get_booster().save_model(  # type: ignore[attr-defined]
        str(repo / "proba" / "1" / "xgboost.json"))
    (repo / "corrupt" / "1" / "xgboost.json").write_text("{ not a model")
    with serving(ShoalServer([str(repo)], ["--exit-on-error=false",
                                           "--strict-readiness=false"])) as srv:
        deadline = time.monotonic() + 240
        while (httpx.get(f"{srv.base}/v2/models/proba/ready").status_code != 200
               and time.monotonic() < deadline):
            time.sleep(0.3)
        yield srv


def test_the_config_is_completed_from_the_model(fil_server: ShoalServer) -> None:
    config = httpx.get(f"{fil_server.base}/v2/models/proba/config").json()
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("input__0", "TYPE_FP32", [FEATURES])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("output__0", "TYPE_FP32", [2])]
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config


def test_outputs_equal_xgboost_predict_proba(fil_server: ShoalServer,
                                             classifier: object) -> None:
    rows = np.random.default_rng(5).standard_normal((3, FEATURES)).astype(np.float32)
    tensor = httpclient.InferInput("input__0", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    result = httpclient.InferenceServerClient(fil_server.url).infer("proba", [tensor])
    np.testing.assert_allclose(result.as_numpy("output__0"),
                               classifier.predict_proba(rows),  # type: ignore[attr-defined]
                               rtol=1e-6, atol=1e-6)


def test_an_unreadable_model_fails_its_load_naming_the_library_error(
        fil_server: ShoalServer, tmp_path_factory: pytest.TempPathFactory) -> None:
    index = {e["name"]: e for e in httpx.post(f"{fil_server.base}/v2/repository/index").json()}
    corrupt = index["corrupt"]
    assert corrupt["state"] == "UNAVAILABLE"
    assert "auto-complete from the xgboost_json model failed: cannot load XGBoost model " \
           "'xgboost.json'" in corrupt["reason"]
    assert str(tmp_path_factory.getbasetemp()) not in corrupt["reason"]
    assert index["proba"]["state"] == "READY"
