"""Build examples/fil_repository/xgboost_fil/1/xgboost.json: a binary XGBoost classifier (100
trees of depth 6 over 16 FP32 features) trained on scikit-learn's synthetic
``make_classification`` data (generated, no download), for the ``fil`` backend and the tree
benchmark (bench/fil_bench.py). The file is committed; this script reproduces it (same seed,
same data, XGBoost's exact tree method). Needs ``pip install 'shoal[trees]' scikit-learn``."""

from __future__ import annotations

import argparse
import pathlib

import numpy as np
import numpy.typing as npt
import xgboost as xgb
from sklearn.datasets import make_classification  # type: ignore[import-untyped]

FEATURES = 16


def training_data(seed: int = 0) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    x, y = make_classification(n_samples=4000, n_features=FEATURES, n_informative=10,
                               random_state=seed)
    return x.astype(np.float32), y.astype(np.int64)


def build(path: pathlib.Path, seed: int = 0) -> xgb.XGBClassifier:
    x, y = training_data(seed)
    model = xgb.XGBClassifier(n_estimators=100, max_depth=6, tree_method="exact",
                              random_state=seed, n_jobs=1)
    model.fit(x, y)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.get_booster().save_model(str(path))
    return model


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    default = (pathlib.Path(__file__).parent / "fil_repository" / "xgboost_fil" / "1"
               / "xgboost.json")
    parser.add_argument("--output", type=pathlib.Path, default=default)
    build(parser.parse_args().output)
