"""The fil backend (tree models, Triton FIL's config) through the real processes: XGBoost,
LightGBM and a scikit-learn forest through a Treelite checkpoint, trained in a fixture on small
random data; outputs equal the libraries' own ``predict`` / ``predict_proba`` over HTTP and
gRPC; dynamic batching merges requests; a corrupt model file and bad parameters fail their
loads with clear errors while the other models keep serving."""

from __future__ import annotations

import concurrent.futures
import pathlib
import textwrap
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

xgb = pytest.importorskip("xgboost")
lgb = pytest.importorskip("lightgbm")
treelite = pytest.importorskip("treelite")
ensemble = pytest.importorskip("sklearn.ensemble")

# a module server with nine tree-model workers: their start took 70-150 s at load 16-30 here
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(360),
              # XGBoost 3 writes the legacy-named xgboost.model as UBJSON (and says so)
              pytest.mark.filterwarnings("ignore:.*Saving model in the UBJSON format")]

FEATURES = 6
SERVED = ("xgb_proba", "xgb_threshold", "xgb_multi_class", "xgb_regression", "lgbm_proba",
          "lgbm_class", "forest_proba")
BROKEN = ("corrupt", "bad_model_type")  # config/model mismatches: tests/workers/test_fil_backend.py


def _config(model_type: str, out_dims: int, *, output_class: bool, predict_proba: bool = False,
            extra: str = "") -> str:
    return textwrap.dedent(f"""
        backend: "fil"
        max_batch_size: 256
        input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }} ]
        output [ {{ name: "output__0" data_type: TYPE_FP32 dims: [ {out_dims} ] }} ]
        instance_group [ {{ kind: KIND_CPU count: 1 }} ]
        dynamic_batching {{ max_queue_delay_microseconds: 50000 }}
        parameters [
          {{ key: "model_type" value: {{ string_value: "{model_type}" }} }},
          {{ key: "output_class" value: {{ string_value: "{str(output_class).lower()}" }} }},
          {{ key: "predict_proba" value: {{ string_value: "{str(predict_proba).lower()}" }} }}
          {extra}
        ]
    """)


def _data(seed: int, rows: int = 300) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, FEATURES)).astype(np.float32)


class Trained:
    """The fixture's models, kept in process as the oracles."""

    def __init__(self) -> None:
        x = _data(0)
        binary = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(int)
        three = np.digitize(x[:, 0] - x[:, 3], [-0.5, 0.5])
        target = x[:, 0] * 2 + np.sin(x[:, 1])
        self.xgb_binary = xgb.XGBClassifier(n_estimators=12, max_depth=3).fit(x, binary)
        self.xgb_multi = xgb.XGBClassifier(n_estimators=8, max_depth=3).fit(x, three)
        self.xgb_regressor = xgb.XGBRegressor(n_estimators=10, max_depth=3).fit(x, target)
        self.lgbm_multi = lgb.LGBMClassifier(n_estimators=10, num_leaves=7,
                                             verbose=-1).fit(x, three)
        self.lgbm_binary = lgb.LGBMClassifier(n_estimators=10, num_leaves=7,
                                              verbose=-1).fit(x, binary)
        self.forest = ensemble.RandomForestClassifier(n_estimators=7, max_depth=5,
                                                      random_state=0).fit(x, three)


def _write(repo: pathlib.Path, name: str, config: str, filename: str,
           save: object) -> pathlib.Path:
    version = repo / name / "1"
    version.mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    path = version / filename
    if callable(save):
        save(str(path))
    return path


@pytest.fixture(scope="module")
def trained() -> Trained:
    return Trained()


@pytest.fixture(scope="module")
def fil_server(trained: Trained,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("fil")
    threshold = ', { key: "threshold" value: { string_value: "0.3" } }'
    _write(repo, "xgb_proba", _config("xgboost_json", 2, output_class=True, predict_proba=True),
           "xgboost.json", trained.xgb_binary.get_booster().save_model)
    _write(repo, "xgb_threshold", _config("xgboost_ubj", 1, output_class=True, extra=threshold),
           "xgboost.ubj", trained.xgb_binary.get_booster().save_model)
    _write(repo, "xgb_multi_class", _config("xgboost", 1, output_class=True), "xgboost.model",
           trained.xgb_multi.get_booster().save_model)
    _write(repo, "xgb_regression", _config("xgboost_json", 1, output_class=False),
           "xgboost.json", trained.xgb_regressor.get_booster().save_model)
    _write(repo, "lgbm_proba", _config("lightgbm", 3, output_class=True, predict_proba=True),
           "model.txt", trained.lgbm_multi.booster_.save_model)
    _write(repo, "lgbm_class", _config("lightgbm", 1, output_class=True), "model.txt",
           trained.lgbm_binary.booster_.save_model)
    forest = treelite.sklearn.import_model(trained.forest)
    _write(repo, "forest_proba", _config("treelite_checkpoint", 3, output_class=True,
                                         predict_proba=True), "checkpoint.tl", forest.serialize)
    corrupt = _write(repo, "corrupt", _config("xgboost_json", 1, output_class=False),
                     "xgboost.json", None)
    corrupt.write_bytes(b'{"learner": this is not a model')
    _write(repo, "bad_model_type", _config("catboost", 1, output_class=False), "model.cbm",
           None)
    server = ShoalServer([str(repo)], ["--exit-on-error=false", "--strict-readiness=false"])
    with serving(server) as srv:
        _wait_loaded(srv)
        yield srv


def _index(server: ShoalServer, client: httpx.Client | None = None) -> dict[str, dict[str, str]]:
    post = client.post if client is not None else httpx.post
    return {entry["name"]: entry for entry in post(f"{server.base}/v2/repository/index").json()}


def _wait_loaded(server: ShoalServer) -> None:
    deadline = time.monotonic() + 240
    with httpx.Client() as client:
        while time.monotonic() < deadline:
            index = _index(server, client)
            served = all(index[name]["state"] == "READY" for name in SERVED)
            failed = all(index[name].get("reason") for name in BROKEN)
            if served and failed:
                return
            time.sleep(0.3)
    raise AssertionError(f"models not loaded: {_index(server)}\n{server.log()}")


def _infer(server: ShoalServer, model: str, rows: np.ndarray) -> np.ndarray:
    inp = httpclient.InferInput("input__0", list(rows.shape), "FP32")
    inp.set_data_from_numpy(rows)
    result = httpclient.InferenceServerClient(server.url).infer(model, [inp])
    output: np.ndarray | None = result.as_numpy("output__0")
    assert output is not None
    return output


def test_xgboost_probabilities_equal_predict_proba(fil_server: ShoalServer,
                                                   trained: Trained) -> None:
    rows = _data(1, 17)
    got = _infer(fil_server, "xgb_proba", rows)
    assert got.shape == (17, 2) and got.dtype == np.float32
    np.testing.assert_array_equal(got, trained.xgb_binary.predict_proba(rows))


def test_xgboost_threshold_decides_binary_classes(fil_server: ShoalServer,
                                                  trained: Trained) -> None:
    rows = _data(2, 200)
    positive = trained.xgb_binary.predict_proba(rows)[:, 1]
    got = _infer(fil_server, "xgb_threshold", rows)
    np.testing.assert_array_equal(got[:, 0], (positive > 0.3).astype(np.float32))
    assert ((positive > 0.3) != (positive > 0.5)).any(), "the data does not test the threshold"


def test_xgboost_multiclass_ids_equal_predict_over_grpc(fil_server: ShoalServer,
                                                        trained: Trained) -> None:
    rows = _data(3, 25)
    inp = grpcclient.InferInput("input__0", list(rows.shape), "FP32")
    inp.set_data_from_numpy(rows)
    result = grpcclient.InferenceServerClient(fil_server.grpc_url).infer("xgb_multi_class", [inp])
    got = result.as_numpy("output__0")
    assert got is not None and got.shape == (25, 1)
    np.testing.assert_array_equal(got[:, 0], trained.xgb_multi.predict(rows))


def test_xgboost_regression_equals_predict(fil_server: ShoalServer, trained: Trained) -> None:
    rows = _data(4, 9)
    got = _infer(fil_server, "xgb_regression", rows)
    np.testing.assert_array_equal(got[:, 0], trained.xgb_regressor.predict(rows))


def test_lightgbm_equals_predict_proba_and_predict(fil_server: ShoalServer,
                                                   trained: Trained) -> None:
    rows = _data(5, 30)
    got = _infer(fil_server, "lgbm_proba", rows)
    assert got.shape == (30, 3)
    np.testing.assert_allclose(got, trained.lgbm_multi.predict_proba(rows), rtol=1e-6)
    classes = _infer(fil_server, "lgbm_class", rows)
    np.testing.assert_array_equal(classes[:, 0], trained.lgbm_binary.predict(rows))


def test_scikit_learn_forest_through_treelite_equals_predict_proba(
        fil_server: ShoalServer, trained: Trained) -> None:
    rows = _data(6, 30)
    got = _infer(fil_server, "forest_proba", rows)
    assert got.shape == (30, 3)
    np.testing.assert_allclose(got, trained.forest.predict_proba(rows), rtol=1e-6, atol=1e-7)


def test_dynamic_batching_merges_requests(fil_server: ShoalServer, trained: Trained) -> None:
    client = httpclient.InferenceServerClient(fil_server.url, concurrency=16)
    before = client.get_inference_statistics("lgbm_proba")["model_stats"][0]
    rows = [_data(100 + i, 1 + i % 3) for i in range(16)]

    def request(row: np.ndarray) -> list[httpclient.InferInput]:
        inp = httpclient.InferInput("input__0", list(row.shape), "FP32")
        inp.set_data_from_numpy(row)
        return [inp]

    pending = [client.async_infer("lgbm_proba", request(row)) for row in rows]
    for row, answer in zip(rows, [p.get_result().as_numpy("output__0") for p in pending],
                           strict=True):
        np.testing.assert_allclose(answer, trained.lgbm_multi.predict_proba(row), rtol=1e-6)
    stats = client.get_inference_statistics("lgbm_proba")["model_stats"][0]
    executions = int(stats["execution_count"]) - int(before["execution_count"])
    assert executions < 16, f"no execution merged requests: {stats['batch_stats']}"
    assert max(b["batch_size"] for b in stats["batch_stats"]) > 3


def test_concurrent_clients_get_their_own_rows(fil_server: ShoalServer,
                                               trained: Trained) -> None:
    def one(seed: int) -> bool:
        rows = _data(seed, 5)
        got = _infer(fil_server, "xgb_proba", rows)
        return bool(np.array_equal(got, trained.xgb_binary.predict_proba(rows)))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert all(pool.map(one, range(200, 232)))


def test_broken_models_fail_their_loads_clearly_and_others_serve(
        fil_server: ShoalServer, trained: Trained,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    index = _index(fil_server)
    assert all(index[name]["state"] == "UNAVAILABLE" for name in BROKEN)
    assert "cannot load XGBoost model 'xgboost.json'" in index["corrupt"]["reason"]
    assert "parameter 'model_type' is 'catboost'" in index["bad_model_type"]["reason"]
    for name in BROKEN:
        assert str(tmp_path_factory.getbasetemp()) not in index[name]["reason"]
    assert all(index[name]["state"] == "READY" for name in SERVED)
    rows = _data(7, 3)
    np.testing.assert_array_equal(_infer(fil_server, "xgb_proba", rows),
                                  trained.xgb_binary.predict_proba(rows))


def test_wrong_feature_count_gets_a_400_naming_the_input(fil_server: ShoalServer) -> None:
    body = {"inputs": [{"name": "input__0", "shape": [1, FEATURES + 1], "datatype": "FP32",
                        "data": [0.5] * (FEATURES + 1)}]}
    response = httpx.post(f"{fil_server.base}/v2/models/xgb_proba/infer", json=body)
    assert response.status_code == 400
    assert "input__0" in response.json()["error"]
