"""The FIL parameters of a model config (Triton FIL backend's names, docs/model_config.md of
triton-inference-server/fil_backend), read and checked at load. Every value is a string, as in
Triton. A bad value is INVALID_ARG naming the parameter; unknown keys are ignored, as Triton's
backends ignore them. The GPU-only tuning knobs (``threads_per_tree``, ``storage_type``,
``algo``, ``blocks_per_sm``, ``transfer_threshold``) and ``use_experimental_optimizations``
are accepted and have no effect here (they never change outputs in Triton either).

``thread_count`` is shoal's own (Triton's FIL backend has none): the threads each instance's
library predicts with. Unset or 0: the usable CPUs less one (kept for the frontend and broker)
divided among the model's CPU instances, at least 1 (``default_threads``). Small batches of
trees gain little from more threads, and OpenMP threads on a busy machine lose a lot.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from tritonclient.grpc.model_config_pb2 import ModelInstanceGroup

from shoal.errors import invalid_arg

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

# model_type -> the file Triton's FIL backend reads when default_model_filename is unset
DEFAULT_FILENAMES: Final = {
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
}
INPUT_NAME: Final = "input__0"
OUTPUT_NAME: Final = "output__0"
_TRUE: Final = ("true", "1", "yes", "on")
_FALSE: Final = ("false", "0", "no", "off")


@dataclass(frozen=True)
class FilParams:
    """``threshold`` applies to binary classifiers only (class 1 when the positive-class
    probability is above it); None means FIL's implicit 0.5."""

    model_type: str
    output_class: bool
    predict_proba: bool
    threshold: float | None
    xgboost_allow_unknown_field: bool
    thread_count: int = 0  # 0: default_threads(config)

    @property
    def default_filename(self) -> str:
        return DEFAULT_FILENAMES[self.model_type]


def config_parameters(config: ModelConfig) -> dict[str, str]:
    """The config's ``parameters`` as plain strings."""
    return {key: value.string_value for key, value in config.parameters.items()}


def parse_params(model: str, params: Mapping[str, str]) -> FilParams:
    model_type = params.get("model_type", "").strip()
    if not model_type:
        raise invalid_arg(f"model '{model}': parameter 'model_type' is required by the fil "
                          f"backend (one of {', '.join(DEFAULT_FILENAMES)})")
    if model_type not in DEFAULT_FILENAMES:
        raise invalid_arg(f"model '{model}': parameter 'model_type' is '{model_type}', expected "
                          f"one of {', '.join(DEFAULT_FILENAMES)}")
    output_class = _flag(model, params, "output_class", default=False)
    predict_proba = _flag(model, params, "predict_proba", default=False)
    if predict_proba and not output_class:
        raise invalid_arg(f"model '{model}': parameter 'predict_proba' is true but "
                          "'output_class' is false: probabilities need a classifier "
                          "(set output_class to true)")
    threshold = _threshold(model, params.get("threshold"))
    allow_unknown = _flag(model, params, "xgboost_allow_unknown_field", default=False)
    threads = params.get("thread_count", "").strip() or "0"
    if not threads.isdigit():
        raise invalid_arg(f"model '{model}': parameter 'thread_count' is '{threads}', expected "
                          "a whole number (0: the default)")
    return FilParams(model_type, output_class, predict_proba, threshold, allow_unknown,
                     int(threads))


def default_threads(config: ModelConfig) -> int:
    """The usable CPUs less one, divided among the model's CPU instances, at least 1."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    instances = sum(max(int(group.count), 1) for group in config.instance_group
                    if group.kind != ModelInstanceGroup.KIND_GPU)
    return max(1, ((cpus or 1) - 1) // max(instances, 1))


def _flag(model: str, params: Mapping[str, str], key: str, *, default: bool) -> bool:
    text = params.get(key)
    if text is None or not text.strip():
        return default
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise invalid_arg(f"model '{model}': parameter '{key}' is '{text}', expected true or false")


def _threshold(model: str, text: str | None) -> float | None:
    if text is None or not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:  # also refuses NaN
        raise invalid_arg(f"model '{model}': parameter 'threshold' is '{text}', expected a "
                          "probability between 0 and 1")
    return value
