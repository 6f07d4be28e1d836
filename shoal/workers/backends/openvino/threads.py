"""The default number of inference threads of one openvino instance (``INFERENCE_NUM_THREADS``
when the config does not set it).

Contract: the server's thread policy for the instance when the worker was given one
(``InstanceContext.default_intra_op_threads`` > 0, from ``shoal/broker/thread_policy.py``);
otherwise each CPU instance of the model gets an equal share of the CPUs this process may run
on, at least 1 (the onnxruntime backend's rule), so the model's instances together use the
machine once instead of each starting a pool as large as it (OpenVINO's own default). This is
the one place the default is chosen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shoal.workers.backends.onnxruntime.session_setup import default_intra_threads

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


def default_inference_threads(config: ModelConfig, policy_threads: int = 0) -> int:
    """Threads for one instance of the model ``config`` (a ``ModelConfig``), at least 1;
    ``policy_threads`` is the server policy's count (0: none)."""
    return policy_threads if policy_threads > 0 else default_intra_threads(config)
