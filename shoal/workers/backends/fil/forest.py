"""One tree model file loaded with its own library into a ``Forest``: a predictor from FP32 rows
to the library's own prediction (what its scikit-learn wrapper's ``predict_proba`` /
``predict`` are made of), so served outputs equal the library's.

Scores: a ``[rows, num_class]`` FP32 array. ``num_class`` is 1 for regressors and for binary
classifiers whose library gives the positive-class probability only (XGBoost, LightGBM), the
class count otherwise (multi-class models, and scikit-learn binary forests through Treelite,
which give both columns). XGBoost ``multi:softmax`` models are run as ``multi:softprob``, the
probabilities FIL returns for them.

The libraries are optional (``shoal[trees]``): a missing one is UNSUPPORTED naming the extra.
A file the library cannot read is INVALID_ARG with the library's message, the directory
stripped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shoal.errors import ErrorCode, ShoalError, invalid_arg

Array = npt.NDArray[Any]
EXTRA = "trees"
_PACKAGES = {"xgboost": "xgboost-cpu", "lightgbm": "lightgbm", "treelite": "treelite"}


@dataclass(frozen=True)
class Forest:
    num_features: int
    num_class: int
    predict: Callable[[Array], Array]  # FP32 [rows, num_features] -> FP32 [rows, num_class]


def load_forest(model_type: str, path: str, *, threads: int,
                allow_unknown_field: bool = False) -> Forest:
    """``model_type`` is one of ``params.DEFAULT_FILENAMES``; ``path`` an existing file;
    ``threads`` (at least 1) the threads the library predicts with."""
    if model_type.startswith("xgboost"):
        return _xgboost(path, threads, allow_unknown_field)
    if model_type == "lightgbm":
        return _lightgbm(path, threads)
    return _treelite(path, threads)


def _import(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError as exc:
        raise ShoalError(ErrorCode.UNSUPPORTED,
                         f"the fil backend needs '{module}', which is not installed: pip "
                         f"install 'shoal[{EXTRA}]' (or pip install {_PACKAGES[module]}) "
                         f"({exc})") from None


def _load_error(kind: str, path: str, exc: BaseException) -> ShoalError:
    name = os.path.basename(path)
    lines = [line.strip() for line in str(exc).splitlines()
             if line.strip() and not line.strip().startswith(("[bt]", "Stack trace"))]
    message = " ".join(lines[:2]) or type(exc).__name__
    message = message.replace(path, name).replace(os.path.dirname(path) + os.sep, "")
    return invalid_arg(f"cannot load {kind} model '{name}': {message}")


def _xgboost(path: str, threads: int, allow_unknown_field: bool) -> Forest:
    xgb = _import("xgboost")
    try:
        booster = xgb.Booster(model_file=path)
    except Exception as exc:
        raise _load_error("XGBoost", path, exc) from None
    del allow_unknown_field  # XGBoost's own loader tolerates unknown JSON fields
    learner = json.loads(booster.save_config())["learner"]
    booster.set_param({"nthread": threads})
    if learner["objective"]["name"] == "multi:softmax":
        booster.set_param({"objective": "multi:softprob"})
    num_class = max(1, int(learner["learner_model_param"].get("num_class", "0")))

    def predict(rows: Array) -> Array:
        scores = booster.inplace_predict(rows, validate_features=False)
        return np.asarray(scores, dtype=np.float32).reshape(rows.shape[0], num_class)

    return Forest(int(booster.num_features()), num_class, predict)


def _lightgbm(path: str, threads: int) -> Forest:
    lgb = _import("lightgbm")
    try:
        booster = lgb.Booster(model_file=path)
    except Exception as exc:
        raise _load_error("LightGBM", path, exc) from None
    num_class = int(booster.num_model_per_iteration())

    def predict(rows: Array) -> Array:
        scores = booster.predict(rows, num_threads=threads)
        return np.asarray(scores, dtype=np.float32).reshape(rows.shape[0], num_class)

    return Forest(int(booster.num_feature()), num_class, predict)


def _treelite(path: str, threads: int) -> Forest:
    treelite = _import("treelite")
    try:
        model = treelite.Model.deserialize(path)
    except Exception as exc:
        raise _load_error("Treelite checkpoint", path, exc) from None
    header = model.get_header_accessor()
    targets = int(header.get_field("num_target")[0])
    if targets != 1:
        raise invalid_arg(f"cannot serve Treelite checkpoint '{os.path.basename(path)}': it "
                          f"has {targets} targets, the fil backend serves one")
    num_class = int(header.get_field("num_class")[0])

    def predict(rows: Array) -> Array:
        scores = treelite.gtil.predict(model, rows, nthread=threads)
        return np.asarray(scores, dtype=np.float32).reshape(rows.shape[0], num_class)

    return Forest(int(model.num_feature), num_class, predict)
