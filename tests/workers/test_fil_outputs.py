"""The fil backend's parameters and output rules (pure functions, no model library needed)."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.errors import ShoalError
from shoal.workers.backends.fil.outputs import fil_output, output_width
from shoal.workers.backends.fil.params import FilParams, parse_params


def _params(**values: str) -> FilParams:
    return parse_params("m", {"model_type": "xgboost_json", **values})


def test_defaults_are_fil_s() -> None:
    params = _params()
    assert (params.output_class, params.predict_proba, params.threshold) == (False, False, None)
    assert params.default_filename == "xgboost.json"
    assert parse_params("m", {"model_type": "lightgbm"}).default_filename == "model.txt"
    assert parse_params("m", {"model_type": "treelite_checkpoint"}).default_filename == \
        "checkpoint.tl"


@pytest.mark.parametrize(("values", "named"), [
    ({"model_type": ""}, "'model_type'"),
    ({"model_type": "catboost"}, "'model_type'"),
    ({"model_type": "lightgbm", "output_class": "maybe"}, "'output_class'"),
    ({"model_type": "lightgbm", "output_class": "true", "predict_proba": "2"}, "'predict_proba'"),
    ({"model_type": "lightgbm", "predict_proba": "true"}, "'predict_proba'"),
    ({"model_type": "lightgbm", "threshold": "1.5"}, "'threshold'"),
    ({"model_type": "lightgbm", "threshold": "nan"}, "'threshold'"),
])
def test_bad_parameters_are_refused_naming_them(values: dict[str, str], named: str) -> None:
    with pytest.raises(ShoalError) as info:
        parse_params("m", values)
    assert named in info.value.message


def test_binary_class_ids_follow_the_threshold() -> None:
    scores = np.array([[0.2], [0.4], [0.6]], np.float32)
    got = fil_output(_params(output_class="true"), scores, 1)
    np.testing.assert_array_equal(got, [[0], [0], [1]])
    got = fil_output(_params(output_class="true", threshold="0.3"), scores, 1)
    np.testing.assert_array_equal(got, [[0], [1], [1]])


def test_binary_probabilities_as_one_or_two_columns() -> None:
    scores = np.array([[0.25]], np.float32)
    params = _params(output_class="true", predict_proba="true")
    np.testing.assert_array_equal(fil_output(params, scores, 2), [[0.75, 0.25]])
    np.testing.assert_array_equal(fil_output(params, scores, 1), [[0.25]])


def test_multiclass_ids_are_the_most_probable_class() -> None:
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]], np.float32)
    np.testing.assert_array_equal(fil_output(_params(output_class="true"), scores, 1), [[1], [0]])


def test_output_width_must_fit_the_model() -> None:
    proba = _params(output_class="true", predict_proba="true")
    assert output_width(proba, 3, 3) == 3
    with pytest.raises(ShoalError, match="output__0"):
        output_width(proba, 3, 1)
    with pytest.raises(ShoalError, match="class ids"):
        output_width(_params(output_class="true"), 3, 3)
    assert output_width(_params(), 1, 1) == 1


def test_thread_count_parameter_and_its_default() -> None:
    from shoal.config.model_config import parse_config_text
    from shoal.workers.backends.fil.params import default_threads

    assert _params(thread_count="3").thread_count == 3
    assert _params().thread_count == 0
    with pytest.raises(ShoalError, match="'thread_count'"):
        _params(thread_count="-1")
    config = parse_config_text('instance_group [ { kind: KIND_CPU count: 64 } ]', "config")
    assert default_threads(config) == 1
