"""MLServer custom runtime for the ONNX benchmark (bench/onnx_bench.py): the same model.onnx
shoal's onnxruntime backend serves, in an ONNX Runtime session with one intra-op thread
(imported by MLServer in its own virtual environment, never by shoal)."""

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxRuntime(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(self.settings.parameters.uri, sess_options=options,
                                             providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name
        self._output = self._session.get_outputs()[0].name
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        (y,) = self._session.run([self._output], {self._input: np.ascontiguousarray(x)})
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output(self._output, y)])
