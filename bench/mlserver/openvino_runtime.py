"""MLServer custom runtime for the OpenVINO benchmark (bench/openvino_bench.py): the same
model.xml shoal's openvino backend serves, compiled for the CPU with one inference thread, one
stream and the LATENCY hint (imported by MLServer in its own virtual environment, never by
shoal)."""

import numpy as np
import openvino as ov
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OpenvinoRuntime(MLModel):
    async def load(self) -> bool:
        core = ov.Core()
        compiled = core.compile_model(core.read_model(self.settings.parameters.uri), "CPU", {
            "INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"})
        self._request = compiled.create_infer_request()
        self._output = compiled.outputs[0].get_any_name()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        y = self._request.infer([np.ascontiguousarray(x)])[0]
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output(self._output, np.array(y))])
