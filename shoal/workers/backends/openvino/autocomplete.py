"""Auto-complete of an openvino model's config from the model, by the rules of Triton's
openvino backend (``AutoCompleteConfig``):

- batching is possible when every model input and output has a layout with a batch (``N``)
  dim (``ov.layout.get_layout``; models converted without a layout cannot batch here, as in
  Triton). Then a ``max_batch_size`` of 0 becomes ``default-max-batch-size``
  (``--backend-config=openvino,default-max-batch-size=N``, default 4, at least 1), and a
  ``max_batch_size`` > 1 without a scheduler gets ``dynamic_batching {}``. A non-zero
  ``max_batch_size`` on a model without batch layouts is kept (Triton only warns);
- inputs (outputs) are filled from the model only when the config has none: name (the
  tensor's first name), data type, and dims without the batch dim when batching.

One difference: Triton writes -1 for every dim of a tensor whose shape is not fully static;
shoal writes each dim's own size (-1 only for a dynamic dim), which its load check accepts.

The model is read by OpenVINO in a throw-away interpreter (``autocomplete_main``), as Triton
reads it in the backend: the broker never imports openvino, and a model file that crashes the
reader fails only that model's load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig, ModelInput, ModelOutput

from shoal.config.model_config import config_from_json, config_to_json
from shoal.errors import invalid_arg
from shoal.workers.backends.model_files import existing_path, newest_version_path
from shoal.workers.backends.openvino.element_types import config_type_name

DEFAULT_MODEL_FILENAME = "model.xml"
_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ModelTensor:
    """A model input or output as auto-complete reads it: first name, wire data type ("" when
    Triton has none), dims (-1 for a dynamic dim; None for a dynamic rank) and whether its
    layout has a batch dim."""

    name: str
    datatype: str
    dims: tuple[int, ...] | None
    has_batch: bool

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "datatype": self.datatype,
                "dims": None if self.dims is None else list(self.dims),
                "has_batch": self.has_batch}

    @staticmethod
    def from_json(item: dict[str, object]) -> ModelTensor:
        dims = item["dims"]
        return ModelTensor(str(item["name"]), str(item["datatype"]),
                           None if dims is None else tuple(int(d) for d in dims),  # type: ignore[attr-defined]
                           bool(item["has_batch"]))


def needs_model(config: ModelConfig) -> bool:
    """False when the model cannot change the config: inputs and outputs given, and either a
    fixed batching choice (``max_batch_size`` 1, or > 1 with a scheduler)."""
    if len(config.input) == 0 or len(config.output) == 0:
        return True
    if config.max_batch_size == 0:
        return True
    scheduled = config.HasField("dynamic_batching") or config.HasField("sequence_batching")
    return config.max_batch_size > 1 and not scheduled


def complete_config(config: ModelConfig, inputs: list[ModelTensor], outputs: list[ModelTensor],
                    default_max_batch_size: int) -> ModelConfig:
    """A copy of ``config`` completed from the model's tensors (see the module docstring)."""
    completed = ModelConfig()
    completed.CopyFrom(config)
    if all(t.has_batch for t in [*inputs, *outputs]):
        if completed.max_batch_size == 0:
            completed.max_batch_size = max(default_max_batch_size, 1)
        if (completed.max_batch_size > 1 and not completed.HasField("dynamic_batching")
                and not completed.HasField("sequence_batching")):
            completed.dynamic_batching.SetInParent()
    if len(config.input) == 0:
        for tensor in inputs:
            _fill_io(completed.input.add(), tensor, completed.max_batch_size)
    if len(config.output) == 0:
        for tensor in outputs:
            _fill_io(completed.output.add(), tensor, completed.max_batch_size)
    return completed


def _fill_io(io: ModelInput | ModelOutput, tensor: ModelTensor, max_batch_size: int) -> None:
    if tensor.dims is None:
        raise invalid_arg(f"auto-complete cannot fill tensor '{tensor.name}': its rank is "
                          "dynamic; give its dims in config.pbtxt")
    io.name = tensor.name
    io.data_type = DataType.Value(config_type_name(tensor.datatype))
    io.dims.extend(tensor.dims[1:] if max_batch_size > 0 else tensor.dims)


# ------------------------------------------------------------------ the broker's call


def model_file_path(model_dir: str, config: ModelConfig) -> str | None:
    """``<version>/<default_model_filename or model.xml>`` of the highest version that has
    it; None when there is none."""
    return newest_version_path(model_dir, config.default_model_filename or DEFAULT_MODEL_FILENAME,
                               existing_path)


def openvino_auto_complete(model_dir: str, config: ModelConfig,
                           default_max_batch_size: int) -> ModelConfig:
    """The broker's call (a load thread): ``config`` completed from the model, read in a
    throw-away interpreter. Returns ``config`` unchanged when the model cannot change it or
    there is no model file (the load then fails with the backend's own message)."""
    if not needs_model(config):
        return config
    path = model_file_path(model_dir, config)
    if path is None:
        return config
    partial = json.dumps(config_to_json(config))
    proc = subprocess.run(
        [sys.executable, "-m", "shoal.workers.backends.openvino.autocomplete_main", path,
         str(default_max_batch_size)],
        input=partial.encode(), capture_output=True, timeout=_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        detail = proc.stderr.decode(errors="replace").strip().splitlines()
        reason = detail[-1] if detail else f"exit code {proc.returncode}"
        raise invalid_arg(f"{os.path.basename(model_dir)}: auto-complete from the OpenVINO "
                          f"model failed: {reason}")
    return config_from_json(proc.stdout)
