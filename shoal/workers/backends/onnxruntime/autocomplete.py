"""Auto-complete of an ONNX model's config from its graph, by the rules of Triton's onnxruntime
backend (``ModelState::AutoCompleteConfig``):

- nothing changes when the config already has inputs (or ``batch_input``) and outputs;
- batching is possible when every graph input and output has a first dim of -1 (symbolic);
  then a ``max_batch_size`` of 0 becomes ``default-max-batch-size`` (``--backend-config=
  onnxruntime,default-max-batch-size=N``, default 4), and a ``max_batch_size`` > 1 without a
  scheduler gets ``dynamic_batching {}``; a non-zero ``max_batch_size`` on a graph that cannot
  batch is an error;
- missing inputs / outputs are filled from the graph (name, data type, dims without the batch
  dim when batching); a tensor left with no dims gets ``dims: [1]`` (plus an empty ``reshape``
  when batching).

Order: Triton keeps the graph's tensors in a hash map, so its order is unspecified; shoal
writes them in graph order.

The graph is read in a throw-away interpreter (as the python backend's auto-complete is), so
the broker never imports ONNX Runtime nor holds a model's weights:
``python -m shoal.workers.backends.onnxruntime.autocomplete <model path> <default max batch>``
reads the partial config (protobuf JSON) on stdin and writes the completed one (Triton /config
JSON) on stdout; on failure one line on stderr and exit status 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig, ModelInput, ModelOutput

from shoal.errors import ShoalError, invalid_arg
from shoal.model_config import config_from_json, config_to_json
from shoal.workers.backends.onnxruntime.graph_io import GraphTensor, config_type_name

DEFAULT_MODEL_FILENAME = "model.onnx"
_TIMEOUT_S = 60.0


def needs_auto_complete(config: ModelConfig) -> bool:
    """False when Triton would skip auto-complete: inputs (or batch inputs) and outputs given."""
    return not ((len(config.input) + len(config.batch_input)) > 0 and len(config.output) > 0)


def complete_config(config: ModelConfig, inputs: list[GraphTensor], outputs: list[GraphTensor],
                    default_max_batch_size: int) -> ModelConfig:
    """A copy of ``config`` completed from the graph's ``inputs`` and ``outputs`` (see the
    module docstring); raises INVALID_ARG as Triton's autofill does."""
    completed = ModelConfig()
    completed.CopyFrom(config)
    if not needs_auto_complete(config):
        return completed
    input_count = len(config.input) + len(config.batch_input)
    _complete_max_batch(completed, [*inputs, *outputs], default_max_batch_size)
    if input_count == 0:
        for tensor in inputs:
            _fill_io(completed.input.add(), tensor, completed.max_batch_size)
    if len(config.output) == 0:
        for tensor in outputs:
            _fill_io(completed.output.add(), tensor, completed.max_batch_size)
    return completed


def _complete_max_batch(config: ModelConfig, tensors: list[GraphTensor],
                        default_max_batch_size: int) -> None:
    can_batch = all(t.dims and t.dims[0] == -1 for t in tensors)
    if not can_batch:
        if config.max_batch_size != 0:
            raise invalid_arg(f"autofill failed for model '{config.name}': model does not "
                              "support batching while non-zero max_batch_size is specified")
        return
    if config.max_batch_size == 0:
        config.max_batch_size = max(default_max_batch_size, 0)
    if (config.max_batch_size > 1 and not config.HasField("sequence_batching")
            and not config.HasField("dynamic_batching")):
        config.dynamic_batching.SetInParent()


def _fill_io(io: ModelInput | ModelOutput, tensor: GraphTensor, max_batch_size: int) -> None:
    io.name = tensor.name
    io.data_type = DataType.Value(config_type_name(tensor))
    dims = list(tensor.dims[1:] if max_batch_size > 0 else tensor.dims)
    if not dims:
        dims = [1]
        if max_batch_size > 0:
            io.reshape.SetInParent()  # an empty reshape: the model takes a scalar per item
    io.dims.extend(dims)


# ------------------------------------------------------------------ broker side


def model_file_path(model_dir: str, config: ModelConfig) -> str | None:
    """The ONNX file auto-complete reads: ``<version>/<default_model_filename>`` of the highest
    version that has it (a directory model is ``<dir>/model.onnx``); None when there is none."""
    filename = config.default_model_filename or DEFAULT_MODEL_FILENAME
    versions = sorted((int(d) for d in os.listdir(model_dir)
                       if d.isascii() and d.isdigit() and (d == "0" or d[0] != "0")),
                      reverse=True)
    for version in versions:
        path = resolve_model_path(os.path.join(model_dir, str(version), filename))
        if path is not None:
            return path
    return None


def resolve_model_path(path: str) -> str | None:
    """A model path as Triton's onnxruntime backend takes it: the file, or ``<dir>/model.onnx``
    when the path is a directory (a model with external data files)."""
    if os.path.isdir(path):
        path = os.path.join(path, DEFAULT_MODEL_FILENAME)
    return path if os.path.isfile(path) else None


def onnx_auto_complete(model_dir: str, config: ModelConfig,
                       default_max_batch_size: int) -> ModelConfig:
    """The broker's call: complete ``config`` in a throw-away interpreter (see the module
    docstring). Returns ``config`` unchanged when nothing is to be completed or there is no
    model file (the load then fails with the backend's own message)."""
    if not needs_auto_complete(config):
        return config
    path = model_file_path(model_dir, config)
    if path is None:
        return config
    from google.protobuf import json_format

    partial = json_format.MessageToJson(config, preserving_proto_field_name=True)
    proc = subprocess.run(
        [sys.executable, "-m", "shoal.workers.backends.onnxruntime.autocomplete", path,
         str(default_max_batch_size)],
        input=partial.encode(), capture_output=True, timeout=_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines()
        detail = lines[-1] if lines else f"exit code {proc.returncode}"
        raise invalid_arg(f"{os.path.basename(model_dir)}: auto-complete from the ONNX graph "
                          f"failed: {detail}")
    return config_from_json(proc.stdout)


# ------------------------------------------------------------------ the throw-away interpreter


def _graph_of(path: str) -> tuple[list[GraphTensor], list[GraphTensor]]:
    from shoal.workers.backends.onnxruntime.graph_io import graph_tensors
    from shoal.workers.backends.onnxruntime.runtime import import_onnxruntime

    ort = import_onnxruntime()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(path, sess_options=options,
                                       providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise invalid_arg(f"cannot load ONNX model '{os.path.basename(path)}': "
                          f"{ort_message(exc, path)}") from None
    return graph_tensors(session.get_inputs()), graph_tensors(session.get_outputs())


def ort_message(exc: BaseException, path: str) -> str:
    """The last line of an ONNX Runtime error, with the model's absolute path cut down to
    ``<model>/<version>/<file>`` (messages never name absolute paths)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[-1] if lines else type(exc).__name__
    parts = os.path.normpath(path).split(os.sep)
    relative = os.path.join(*parts[-4:]) if parts[-2] == "model.onnx" else \
        os.path.join(*parts[-3:])
    return text.replace(path, relative)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m shoal.workers.backends.onnxruntime.autocomplete "
                         "<model path> <default max batch size>\n")
        return 1
    try:
        partial = config_from_json(sys.stdin.read() or "{}")
        with contextlib.redirect_stdout(sys.stderr):
            inputs, outputs = _graph_of(args[0])
            completed = complete_config(partial, inputs, outputs, int(args[1]))
        sys.stdout.write(json.dumps(config_to_json(completed)) + "\n")
    except ShoalError as exc:
        sys.stderr.write(exc.message.replace("\n", " ") + "\n")
        return 1
    except Exception as exc:
        sys.stderr.write(f"auto-complete failed: {type(exc).__name__}: {exc}\n".replace(
            "\n", " ").rstrip() + "\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
