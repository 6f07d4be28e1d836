"""Auto-complete of a SavedModel's config from its serving signature, by the rules of Triton's
tensorflow backend (``AutoCompleteHelper``: ``FixBatchingSupport`` then ``FixIOConfig``):

- the signature can batch when every input and output has rank >= 1 and a first dim of -1; a
  non-zero ``max_batch_size`` on a signature that cannot batch is an error;
- with ``max_batch_size`` 0 on a signature that can batch, the config's own tensors decide
  (a tensor whose dims, or reshape, are one shorter than the signature's rank says "batching",
  the same length says "no batching"; two that disagree are an error); then ``max_batch_size``
  becomes ``default-max-batch-size`` (``--backend-config=tensorflow,default-max-batch-size=N``,
  default 4) when batching, else stays 0;
- ``max_batch_size`` > 1 without a scheduler gets ``dynamic_batching {}``;
- inputs (outputs) are filled from the signature when the config has none: name = the
  signature key, data type, dims without the batch dim when batching (a tensor left with no dims
  gets ``dims: [1]`` and an empty ``reshape``); a rank-0 (or unknown-rank) signature tensor
  cannot be filled. When the config has them, each one that names a signature tensor of known
  rank must have as many dims as that rank (less the batch dim).

``tensorflow_graphdef`` models are not completed (a GraphDef has no signature), as in Triton.
The broker reads the signature from ``saved_model.pb`` (``signature.py``) on its load thread:
no TensorFlow import, no interpreter to start, no variables read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Final

from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig, ModelInput, ModelOutput

from shoal.errors import ShoalError, invalid_arg
from shoal.workers.backends.model_files import existing_dir, newest_version_path
from shoal.workers.backends.tensorflow.params import tf_parameters
from shoal.workers.backends.tensorflow.signature import Signature, SignatureTensor, read_signature

SAVEDMODEL_PLATFORM: Final = "tensorflow_savedmodel"
DEFAULT_MODEL_FILENAME: Final = "model.savedmodel"


def complete_config(config: ModelConfig, signature: Signature,
                    default_max_batch_size: int) -> ModelConfig:
    """A copy of ``config`` completed from ``signature`` (see the module docstring); raises
    INVALID_ARG as Triton's autofill does."""
    completed = ModelConfig()
    completed.CopyFrom(config)
    batching = _fix_batching(completed, signature, default_max_batch_size)
    _fix_ios(completed, completed.input, signature.inputs, batching)
    _fix_ios(completed, completed.output, signature.outputs, batching)
    return completed


def _fix_batching(config: ModelConfig, signature: Signature, default_max_batch_size: int) -> bool:
    tensors = [*signature.inputs, *signature.outputs]
    can_batch = all(t.dims and t.dims[0] == -1 for t in tensors)
    if not can_batch and config.max_batch_size > 0:
        raise invalid_arg(f"unable to autofill for '{config.name}', configuration specified "
                          f"max-batch {config.max_batch_size} but model signature does not "
                          "support batching")
    batching = can_batch
    if can_batch and config.max_batch_size == 0:
        batching = _config_hint(config, signature, can_batch)
    if config.max_batch_size == 0:
        config.max_batch_size = max(default_max_batch_size, 0) if batching else 0
    if (config.max_batch_size > 1 and not config.HasField("sequence_batching")
            and not config.HasField("dynamic_batching")):
        config.dynamic_batching.SetInParent()
    return bool(config.max_batch_size > 0)


def _config_hint(config: ModelConfig, signature: Signature, batching: bool) -> bool:
    """Whether the config's own tensors say the model batches (``batching`` when none says)."""
    hinted: bool | None = None
    pairs: list[tuple[Sequence[ModelInput | ModelOutput], list[SignatureTensor]]] = [
        (config.input, signature.inputs), (config.output, signature.outputs)]
    for ios, tensors in pairs:
        by_name = {t.name: t for t in tensors}
        for io in ios:
            dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
            tensor = by_name.get(io.name)
            if not dims or tensor is None:
                continue
            says = len(tensor.dims) == len(dims) + 1
            if hinted is not None and hinted != says:
                raise invalid_arg(f"unable to autofill for '{config.name}', model tensor "
                                  "configurations are contradicting each other in terms of "
                                  "whether batching is supported")
            hinted = says
    return batching if hinted is None else hinted


def _fix_ios(config: ModelConfig, ios: Any, tensors: list[SignatureTensor],
             batching: bool) -> None:
    """``ios``: the config's repeated ``input`` or ``output`` field."""
    existing = list(ios)
    if not existing:
        for tensor in tensors:
            if not tensor.dims:
                raise invalid_arg(f"unable to autofill for '{config.name}': the rank of model "
                                  f"tensor '{tensor.name}' is 0 which is not supported")
            _fill_io(ios.add(), tensor, batching)
        return
    by_name = {t.name: t for t in tensors}
    for io in existing:
        known = by_name.get(io.name)
        if known is None or not known.dims:
            continue  # the load's check names an unknown tensor; rank 0: the config decides
        rank = len(known.dims) - (1 if batching else 0)
        if len(io.dims) != rank:
            raise invalid_arg(f"unable to autofill for '{config.name}': number of dimensions "
                              f"({len(io.dims)}) given for '{io.name}' in configuration does "
                              f"not match the rank ({rank}) of the loaded model")


def _fill_io(io: ModelInput | ModelOutput, tensor: SignatureTensor, batching: bool) -> None:
    io.name = tensor.name
    wire = tensor.datatype
    io.data_type = DataType.Value("TYPE_STRING" if wire == "BYTES" else f"TYPE_{wire}")
    dims = list(tensor.dims[1:] if batching else tensor.dims)
    if not dims:
        dims = [1]
        io.reshape.SetInParent()  # an empty reshape: the model takes a scalar per item
    io.dims.extend(dims)


# ------------------------------------------------------------------ the broker's call


def savedmodel_path(model_dir: str, config: ModelConfig) -> str | None:
    """The SavedModel directory auto-complete reads: ``<version>/<default_model_filename>`` of
    the highest version that has one; None when there is none."""
    return newest_version_path(model_dir, config.default_model_filename or DEFAULT_MODEL_FILENAME,
                               existing_dir)


def tensorflow_auto_complete(model_dir: str, config: ModelConfig,
                             default_max_batch_size: int) -> ModelConfig:
    """The broker's call: ``config`` completed from the SavedModel's signature. Unchanged for a
    GraphDef model or when there is no SavedModel directory (the load then fails with the
    backend's own message)."""
    if config.platform and config.platform != SAVEDMODEL_PLATFORM:
        return config
    path = savedmodel_path(model_dir, config)
    if path is None:
        return config
    params = tf_parameters(config)
    try:
        signature = read_signature(path, config.name, params.graph_tag, params.signature_def)
    except ShoalError as exc:
        raise ShoalError(exc.code, f"{os.path.basename(model_dir)}: auto-complete from the "
                         f"SavedModel signature failed: {exc.message}") from None
    return complete_config(config, signature, default_max_batch_size)
