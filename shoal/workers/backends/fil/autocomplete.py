"""Auto-complete of a fil model's config from the model file, so a config.pbtxt may give only the
backend and the FIL parameters (``model_type``, ``output_class``, ``predict_proba``):

- when the config has no input, ``input__0`` FP32 ``[num_features]`` (the model's feature
  count) is added;
- when it has no output, ``output__0`` FP32 with FIL's width for the parameters: regression
  values ``[num_class]`` (``[1]``), class probabilities (``predict_proba``) ``[num_class]``,
  ``[2]`` for a binary model (both classes, as ``predict_proba`` gives them), class ids
  ``[1]``;
- the fil backend always batches: a ``max_batch_size`` of 0 becomes ``default-max-batch-size``
  (``--backend-config=fil,default-max-batch-size=N``, default 4, at least 1), and one above 1
  without a scheduler gets ``dynamic_batching {}`` (Triton's rule for backends that batch).

Nothing changes when the config has both an input and an output. The model is read by its own
library in a throw-away interpreter (``autocomplete_main``): the broker never imports XGBoost,
LightGBM or Treelite, and a file that crashes a library fails only that model's load. A bad
FIL parameter fails here with the message the load would give.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Final

from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig

from shoal.errors import invalid_arg
from shoal.workers.backends.fil.params import (
    INPUT_NAME,
    OUTPUT_NAME,
    FilParams,
    config_parameters,
    parse_params,
)
from shoal.workers.backends.model_files import existing_file, newest_version_path

_TIMEOUT_S: Final = 120.0


@dataclass(frozen=True)
class ForestShape:
    """What auto-complete needs of a model: its feature count and scores per row (``Forest``)."""

    num_features: int
    num_class: int


def needs_auto_complete(config: ModelConfig) -> bool:
    return len(config.input) == 0 or len(config.output) == 0


def output_dims(params: FilParams, num_class: int) -> int:
    """The width of ``output__0`` auto-complete writes (one ``outputs.output_width`` accepts)."""
    if not params.output_class:
        return num_class
    if params.predict_proba:
        return 2 if num_class == 1 else num_class
    return 1


def complete_config(config: ModelConfig, params: FilParams, shape: ForestShape,
                    default_max_batch_size: int) -> ModelConfig:
    """A copy of ``config`` completed from the model's ``shape`` (see the module docstring)."""
    completed = ModelConfig()
    completed.CopyFrom(config)
    if not needs_auto_complete(config):
        return completed
    if completed.max_batch_size == 0:
        completed.max_batch_size = max(default_max_batch_size, 1)
    if (completed.max_batch_size > 1 and not completed.HasField("dynamic_batching")
            and not completed.HasField("sequence_batching")):
        completed.dynamic_batching.SetInParent()
    fp32 = DataType.Value("TYPE_FP32")
    if len(config.input) == 0:
        completed.input.add(name=INPUT_NAME, data_type=fp32, dims=[shape.num_features])
    if len(config.output) == 0:
        completed.output.add(name=OUTPUT_NAME, data_type=fp32,
                             dims=[output_dims(params, shape.num_class)])
    return completed


# ------------------------------------------------------------------ the broker's call


def model_file_path(model_dir: str, config: ModelConfig, params: FilParams) -> str | None:
    """``<version>/<default_model_filename or the model_type's file>`` of the highest version
    that has it; None when there is none."""
    return newest_version_path(model_dir, config.default_model_filename or params.default_filename,
                               existing_file)


def fil_auto_complete(model_dir: str, config: ModelConfig,
                      default_max_batch_size: int) -> ModelConfig:
    """The broker's call (a load thread): ``config`` completed from the model file, read in a
    throw-away interpreter. Unchanged when nothing is to be completed or there is no model
    file (the load then fails with the backend's own message)."""
    if not needs_auto_complete(config):
        return config
    model = os.path.basename(model_dir)
    params = parse_params(config.name or model, config_parameters(config))
    path = model_file_path(model_dir, config, params)
    if path is None:
        return config
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "shoal.workers.backends.fil.autocomplete_main",
             params.model_type, path],
            capture_output=True, timeout=_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise invalid_arg(f"{model}: auto-complete from the {params.model_type} model timed "
                          f"out after {_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        detail = proc.stderr.decode(errors="replace").strip().splitlines()
        reason = detail[-1] if detail else f"exit code {proc.returncode}"
        raise invalid_arg(f"{model}: auto-complete from the {params.model_type} model "
                          f"failed: {reason}")
    try:
        found = json.loads(proc.stdout)
        shape = ForestShape(int(found["num_features"]), int(found["num_class"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise invalid_arg(f"{model}: auto-complete from the {params.model_type} model gave "
                          f"no shape ({exc})") from None
    return complete_config(config, params, shape, default_max_batch_size)
