"""The tensorflow backend's config parameters, with the names Triton's tensorflow backend reads,
and its thread counts.

Parameters (string values): ``TF_GRAPH_TAG`` (the meta graph's tag, default ``serve``),
``TF_SIGNATURE_DEF`` (default ``serving_default``), ``TF_NUM_INTRA_THREADS`` and
``TF_NUM_INTER_THREADS`` (non-negative; 0 or absent = the default below). Triton's
``MAX_SESSION_SHARE_COUNT`` and ``TF_USE_PER_SESSION_THREADS`` are accepted and have nothing to
do here: every instance is its own worker process with its own TensorFlow runtime.

Threads (``thread_counts``, the one place that decides them): intra-op, in order,
``TF_NUM_INTRA_THREADS``, ``--backend-config=tensorflow,intra-op-thread-count=N``, the
server's thread policy for the instance (``InstanceContext.default_intra_op_threads``, when
the worker was given one), else an equal share of the CPUs among the model's CPU instances
(as the onnxruntime backend's default). Inter-op: ``TF_NUM_INTER_THREADS``, else 1 (a worker
runs one batch at a time; TensorFlow's own default is one thread per core).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shoal.errors import invalid_arg
from shoal.workers.backends.onnxruntime.session_setup import default_intra_threads
from shoal.workers.backends.tensorflow.signature import DEFAULT_SIGNATURE, SERVE_TAG

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


@dataclass(frozen=True)
class TfParameters:
    graph_tag: str
    signature_def: str
    intra_op_threads: int  # 0: not named
    inter_op_threads: int  # 0: not named


def tf_parameters(config: ModelConfig) -> TfParameters:
    """The parameters of ``config`` (a ModelConfig); INVALID_ARG as Triton words it for a bad
    thread count."""
    params = {key: value.string_value for key, value in config.parameters.items()}
    return TfParameters(
        graph_tag=params.get("TF_GRAPH_TAG", "").strip() or SERVE_TAG,
        signature_def=params.get("TF_SIGNATURE_DEF", "").strip() or DEFAULT_SIGNATURE,
        intra_op_threads=_count(params, "TF_NUM_INTRA_THREADS", config.name),
        inter_op_threads=_count(params, "TF_NUM_INTER_THREADS", config.name))


def thread_counts(params: TfParameters, config: ModelConfig, backend_settings: Mapping[str, str],
                  policy_threads: int) -> tuple[int, int]:
    """(intra-op, inter-op) threads for one instance (see the module docstring);
    ``policy_threads`` is the server's thread policy count, 0 when none."""
    intra = params.intra_op_threads
    if intra == 0:
        intra = _count(backend_settings, "intra-op-thread-count", config.name)
    if intra == 0:
        intra = policy_threads if policy_threads > 0 else default_intra_threads(config)
    return intra, params.inter_op_threads or 1


def _count(params: Mapping[str, str], key: str, model: str) -> int:
    text = params.get(key, "").strip()
    if not text:
        return 0
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise invalid_arg(f"parameter '{key}' must be non-negative number for TensorFlow model "
                          f"'{model}', got '{text}'")
    return value
