"""Python-model auto-complete: ``TritonPythonModel.auto_complete_config`` (Triton §4.1).

Triton runs it in a throw-away stub; shoal runs it in a throw-away interpreter:
``python -m shoal.workers.autocomplete <model_py_path>`` reads the partial config as protobuf JSON
(Triton /config style or ``json_format`` output) on stdin and writes the completed config as
Triton /config JSON on stdout. On failure it writes one line naming the problem on stderr and
exits with status 1. This module never imports torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

from tritonclient.grpc.model_config_pb2 import ModelConfig

from shoal.config.model_config import config_from_json, config_to_json
from shoal.errors import ShoalError, invalid_arg
from shoal.workers.backends.python import pb_utils
from shoal.workers.backends.python.loader import import_model_file


def run_auto_complete(model_py_path: str, config: ModelConfig) -> ModelConfig:
    """The config completed by the model's ``auto_complete_config`` (a copy of ``config`` when the
    model defines none). Raises INVALID_ARG when the model rejects or breaks the config."""
    label = config.name or os.path.basename(os.path.dirname(os.path.dirname(model_py_path)))
    module = import_model_file(model_py_path)
    model_class = getattr(module, "TritonPythonModel", None)
    if model_class is None:
        raise invalid_arg(f"python model file '{os.path.basename(model_py_path)}' of model "
                          f"'{label}' does not define class TritonPythonModel")
    completed = ModelConfig()
    completed.CopyFrom(config)
    auto_complete = getattr(model_class, "auto_complete_config", None)
    if auto_complete is None:
        return completed
    wrapper = pb_utils.ModelConfig(json.dumps(config_to_json(config)))
    try:
        result = auto_complete(wrapper)
    except Exception as exc:
        raise invalid_arg(f"auto_complete_config of model '{label}' failed: "
                          f"{type(exc).__name__}: {exc}") from None
    if not isinstance(result, pb_utils.ModelConfig):
        raise invalid_arg(f"auto_complete_config of model '{label}' must return the "
                          f"pb_utils.ModelConfig it was given, got {type(result).__name__}")
    return config_from_json(json.dumps(result.as_dict()))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m shoal.workers.autocomplete <model_py_path>\n")
        return 1
    try:
        partial = config_from_json(sys.stdin.read() or "{}")
        with contextlib.redirect_stdout(sys.stderr):  # model prints must not corrupt the JSON
            completed = run_auto_complete(args[0], partial)
        sys.stdout.write(json.dumps(config_to_json(completed)))
        sys.stdout.write("\n")
    except ShoalError as exc:
        _fail(exc.message)
        return 1
    except Exception as exc:
        _fail(f"auto-complete failed: {type(exc).__name__}: {exc}")
        return 1
    return 0


def _fail(message: str) -> None:
    sys.stderr.write(message.replace("\n", " ") + "\n")


if __name__ == "__main__":
    sys.exit(main())
