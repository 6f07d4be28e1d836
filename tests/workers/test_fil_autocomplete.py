"""fil auto-complete: input__0 and output__0 filled from the model file (feature count, and the
output width FIL gives for output_class / predict_proba), batching made the default, read in a
throw-away interpreter on real XGBoost and LightGBM files; a corrupt file and a bad parameter
fail naming the problem; and the completed config loads in the backend."""

from __future__ import annotations

import pathlib
import textwrap
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.config.model_config import config_to_json
from shoal.errors import ShoalError
from shoal.workers.backends.base import InstanceContext
from shoal.workers.backends.fil.autocomplete import (
    ForestShape,
    complete_config,
    fil_auto_complete,
)
from shoal.workers.backends.fil.backend import FilBackend
from shoal.workers.backends.fil.params import parse_params

xgb = pytest.importorskip("xgboost")
lgb = pytest.importorskip("lightgbm")

FEATURES = 5


def parse(text: str) -> ModelConfig:
    return text_format.Parse(textwrap.dedent(text), ModelConfig(name="trees"))


def fil_config(model_type: str, output_class: bool, predict_proba: bool = False) -> str:
    return textwrap.dedent(f"""
        backend: "fil"
        parameters [
          {{ key: "model_type" value: {{ string_value: "{model_type}" }} }},
          {{ key: "output_class" value: {{ string_value: "{str(output_class).lower()}" }} }},
          {{ key: "predict_proba" value: {{ string_value: "{str(predict_proba).lower()}" }} }}
        ]
    """)


def io(config: ModelConfig) -> tuple[list[Any], list[Any]]:
    doc: Any = config_to_json(config)
    return ([(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in doc["input"]],
            [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in doc["output"]])


@pytest.mark.parametrize(("output_class", "predict_proba", "num_class", "width"), [
    (False, False, 1, 1),  # regression
    (True, True, 1, 2),  # binary probabilities: both classes
    (True, True, 3, 3),
    (True, False, 3, 1),  # class ids
])
def test_tensors_are_filled_as_fil_names_them(output_class: bool, predict_proba: bool,
                                              num_class: int, width: int) -> None:
    config = parse(fil_config("xgboost_json", output_class, predict_proba))
    params = parse_params("trees", {p: v.string_value for p, v in config.parameters.items()})
    completed = complete_config(config, params, ForestShape(FEATURES, num_class), 4)
    assert io(completed) == ([("input__0", "TYPE_FP32", [FEATURES])],
                             [("output__0", "TYPE_FP32", [width])])
    assert completed.max_batch_size == 4 and completed.HasField("dynamic_batching")


def test_a_config_with_both_tensors_is_left_alone() -> None:
    config = parse(fil_config("xgboost_json", False) + """
        input [ { name: "input__0" data_type: TYPE_FP32 dims: [ 7 ] } ]
        output [ { name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
    """)
    assert fil_auto_complete("/nonexistent", config, 4) is config


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("fil-autocomplete")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((150, FEATURES)).astype(np.float32)
    for name, model_type, filename, fit in (
            ("xgb", "xgboost_json", "xgboost.json",
             lambda: xgb.XGBClassifier(n_estimators=3, max_depth=2).fit(
                 x, (x[:, 0] > 0).astype(int)).get_booster()),
            ("lgbm", "lightgbm", "model.txt",
             lambda: lgb.LGBMClassifier(n_estimators=3, num_leaves=4, verbose=-1).fit(
                 x, (x[:, 1] > 0).astype(int) + (x[:, 2] > 1).astype(int)).booster_)):
        (root / name / "1").mkdir(parents=True)
        fit().save_model(str(root / name / "1" / filename))
        (root / name / "config.pbtxt").write_text(fil_config(model_type, True, True))
    return root


def test_an_xgboost_file_is_read_in_a_throwaway_interpreter(models: pathlib.Path) -> None:
    config = parse(fil_config("xgboost_json", True, True))
    completed = fil_auto_complete(str(models / "xgb"), config, 8)
    assert io(completed) == ([("input__0", "TYPE_FP32", [FEATURES])],
                             [("output__0", "TYPE_FP32", [2])])
    assert completed.max_batch_size == 8


def test_a_multiclass_lightgbm_file_gives_one_probability_per_class(
        models: pathlib.Path) -> None:
    config = parse(fil_config("lightgbm", True, True) + "max_batch_size: 64")
    completed = fil_auto_complete(str(models / "lgbm"), config, 4)
    assert io(completed)[1] == [("output__0", "TYPE_FP32", [3])]
    assert completed.max_batch_size == 64


def test_the_completed_config_loads_in_the_backend(models: pathlib.Path) -> None:
    completed = fil_auto_complete(str(models / "xgb"),
                                  parse(fil_config("xgboost_json", True, True)), 4)
    ctx = InstanceContext("trees", 1, str(models / "xgb"), str(models / "xgb" / "1"), completed,
                          "{}", "trees_0", "CPU", "cpu", 0)
    backend = FilBackend()
    backend.load(ctx)  # the backend's own check of input__0 / output__0 against the model
    backend.unload()


def test_a_corrupt_file_and_a_bad_parameter_fail_naming_the_problem(
        tmp_path: pathlib.Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "xgboost.json").write_text("{ not json")
    with pytest.raises(ShoalError) as info:
        fil_auto_complete(str(tmp_path), parse(fil_config("xgboost_json", True)), 4)
    assert "auto-complete from the xgboost_json model failed: cannot load XGBoost model " \
           "'xgboost.json'" in info.value.message
    assert str(tmp_path) not in info.value.message
    with pytest.raises(ShoalError, match="parameter 'model_type' is 'catboost'"):
        fil_auto_complete(str(tmp_path), parse(fil_config("catboost", True)), 4)
