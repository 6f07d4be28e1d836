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

Triton reads the graph by creating a session; the broker reads only the graph's inputs and
outputs from the file's protobuf (``onnx_graph``), on its load thread: no ONNX Runtime, no
interpreter to start, no weights read.
"""

from __future__ import annotations

import os

from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig, ModelInput, ModelOutput

from shoal.errors import ShoalError, invalid_arg
from shoal.workers.backends.model_files import newest_version_path
from shoal.workers.backends.onnxruntime.graph_io import GraphTensor, config_type_name
from shoal.workers.backends.onnxruntime.onnx_graph import read_graph_io

DEFAULT_MODEL_FILENAME = "model.onnx"


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


# ------------------------------------------------------------------ the broker's call


def model_file_path(model_dir: str, config: ModelConfig) -> str | None:
    """The ONNX file auto-complete reads: ``<version>/<default_model_filename>`` of the highest
    version that has it (a directory model is ``<dir>/model.onnx``); None when there is none."""
    return newest_version_path(model_dir, config.default_model_filename or DEFAULT_MODEL_FILENAME,
                               resolve_model_path)


def resolve_model_path(path: str) -> str | None:
    """A model path as Triton's onnxruntime backend takes it: the file, or ``<dir>/model.onnx``
    when the path is a directory (a model with external data files)."""
    if os.path.isdir(path):
        path = os.path.join(path, DEFAULT_MODEL_FILENAME)
    return path if os.path.isfile(path) else None


def onnx_auto_complete(model_dir: str, config: ModelConfig,
                       default_max_batch_size: int) -> ModelConfig:
    """The broker's call: ``config`` completed from the graph (see the module docstring).
    Returns ``config`` unchanged when nothing is to be completed or there is no model file (the
    load then fails with the backend's own message)."""
    if not needs_auto_complete(config):
        return config
    path = model_file_path(model_dir, config)
    if path is None:
        return config
    try:
        inputs, outputs = read_graph_io(path)
    except ShoalError as exc:
        raise ShoalError(exc.code, f"{os.path.basename(model_dir)}: auto-complete from the "
                         f"ONNX graph failed: {exc.message}") from None
    return complete_config(config, inputs, outputs, default_max_batch_size)


def ort_message(exc: BaseException, path: str) -> str:
    """The last line of an ONNX Runtime error, with the model's absolute path cut down to
    ``<model>/<version>/<file>`` (messages never name absolute paths)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[-1] if lines else type(exc).__name__
    parts = os.path.normpath(path).split(os.sep)
    relative = os.path.join(*parts[-4:]) if parts[-2] == "model.onnx" else \
        os.path.join(*parts[-3:])
    return text.replace(path, relative)
