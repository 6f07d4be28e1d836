"""The fil backend in process: the config checked against the model at load (each refusal
names the parameter or tensor at fault) and a batch of requests predicted as one."""

from __future__ import annotations

import pathlib
import sys
import textwrap

import numpy as np
import pytest

from shoal.config.model_config import parse_config_text
from shoal.errors import ShoalError
from shoal.workers.backends.base import BackendRequest, BackendResponse, InstanceContext
from shoal.workers.backends.fil.backend import FilBackend

xgb = pytest.importorskip("xgboost")

FEATURES = 4


def _config(*, out_dims: int = 2, max_batch: int = 8, input_name: str = "input__0",
            filename: str = "") -> str:
    default = f'default_model_filename: "{filename}"' if filename else ""
    return textwrap.dedent(f"""
        name: "trees"
        backend: "fil"
        max_batch_size: {max_batch}
        {default}
        input [ {{ name: "{input_name}" data_type: TYPE_FP32 dims: [ {FEATURES} ] }} ]
        output [ {{ name: "output__0" data_type: TYPE_FP32 dims: [ {out_dims} ] }} ]
        parameters [
          {{ key: "model_type" value: {{ string_value: "xgboost_json" }} }},
          {{ key: "output_class" value: {{ string_value: "true" }} }},
          {{ key: "predict_proba" value: {{ string_value: "true" }} }}
        ]
    """)


@pytest.fixture(scope="module")
def classifier() -> object:
    x = np.random.default_rng(0).standard_normal((120, FEATURES)).astype(np.float32)
    return xgb.XGBClassifier(n_estimators=4, max_depth=2).fit(x, (x[:, 0] > 0).astype(int))


def _load(tmp_path: pathlib.Path, classifier: object, config_text: str) -> FilBackend:
    version = tmp_path / "1"
    version.mkdir(exist_ok=True)
    classifier.get_booster().save_model(str(version / "xgboost.json"))  # type: ignore[attr-defined]
    config = parse_config_text(config_text, "config.pbtxt")
    ctx = InstanceContext("trees", 1, str(tmp_path), str(version), config, "{}", "trees_0",
                          "CPU", "cpu", 0)
    backend = FilBackend()
    backend.load(ctx)
    return backend


@pytest.mark.parametrize(("config_text", "named"), [
    (_config(out_dims=3), "output 'output__0' has dims [3], expected [1] or [2]"),
    (_config(max_batch=0), "'max_batch_size'"),
    (_config(input_name="x"), "'input__0'"),
    (_config(filename="elsewhere.json"), "model file 'elsewhere.json'"),
])
def test_config_that_does_not_fit_is_refused_naming_the_field(
        tmp_path: pathlib.Path, classifier: object, config_text: str, named: str) -> None:
    with pytest.raises(ShoalError) as info:
        _load(tmp_path, classifier, config_text)
    assert named in info.value.message


def test_requests_of_a_batch_are_predicted_together(tmp_path: pathlib.Path,
                                                    classifier: object) -> None:
    backend = _load(tmp_path, classifier, _config())
    rows = np.random.default_rng(1).standard_normal((5, FEATURES)).astype(np.float32)
    requests = [BackendRequest(0, {"input__0": rows[:2]}, {"input__0": "FP32"}, ["output__0"],
                               {}, batch_size=2),
                BackendRequest(1, {"input__0": rows[2:]}, {"input__0": "FP32"}, ["output__0"],
                               {}, batch_size=3),
                BackendRequest(2, {"input__0": rows[:1, :3]}, {"input__0": "FP32"},
                               ["output__0"], {}, batch_size=1)]
    results = backend.execute(requests)
    expected = classifier.predict_proba(rows)  # type: ignore[attr-defined]
    first, second, bad = results
    assert isinstance(first, BackendResponse) and isinstance(second, BackendResponse)
    np.testing.assert_array_equal(first.outputs[0].array, expected[:2])
    np.testing.assert_array_equal(second.outputs[0].array, expected[2:])
    assert bad is not None and not isinstance(bad, BackendResponse)
    assert "'input__0' has shape [1, 3]" in bad.message


def test_example_xgboost_repository_equals_predict_proba() -> None:
    """examples/fil_repository/xgboost_fil: its committed model, loaded with its config by the
    broker's reader and run by the backend, equals XGBClassifier.predict_proba of the same file
    on the example's training rows."""
    from shoal.broker.repository import load_model_source

    examples = pathlib.Path(__file__).resolve().parents[2] / "examples"
    model_dir = examples / "fil_repository" / "xgboost_fil"
    source = load_model_source("xgboost_fil", str(model_dir), str(model_dir.parent),
                               default_max_batch_size=4, gpu_count=0, auto_complete=None)
    backend = FilBackend()
    backend.load(InstanceContext("xgboost_fil", 1, str(model_dir), str(model_dir / "1"),
                                 source.config, "{}", "xgboost_fil_0", "CPU", "cpu", 0))
    rows = np.random.default_rng(2).standard_normal((7, 16)).astype(np.float32)
    answer = backend.execute([BackendRequest(0, {"input__0": rows}, {"input__0": "FP32"},
                                             ["output__0"], {}, batch_size=7)])[0]
    assert isinstance(answer, BackendResponse)
    oracle = xgb.XGBClassifier()
    oracle.load_model(str(model_dir / "1" / "xgboost.json"))
    np.testing.assert_array_equal(answer.outputs[0].array, oracle.predict_proba(rows))


def test_missing_library_is_unsupported_naming_the_extra(
        tmp_path: pathlib.Path, classifier: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "xgboost", None)  # import xgboost raises ImportError
    with pytest.raises(ShoalError) as info:
        _load(tmp_path, classifier, _config())
    assert info.value.code.name == "UNSUPPORTED"
    assert "pip install 'shoal[trees]'" in info.value.message
