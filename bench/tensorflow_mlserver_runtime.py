"""MLServer custom runtime for the TensorFlow benchmark (bench/tensorflow_bench.py): the same
SavedModel shoal's tensorflow backend serves, its serving signature called with one intra-op
and one inter-op thread (imported by MLServer in its own virtual environment, never by shoal)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class TensorflowRuntime(MLModel):
    async def load(self) -> bool:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        self._loaded = tf.saved_model.load(self.settings.parameters.uri)
        self._function = self._loaded.signatures["serving_default"]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        y = self._function(INPUT__0=tf.constant(x))["OUTPUT__0"].numpy()
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output("OUTPUT__0", y)])
