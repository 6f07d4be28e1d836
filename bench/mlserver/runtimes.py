"""MLServer custom runtimes for the side-by-side benchmark (imported by MLServer 1.7.1 in its own
virtual environment, never by shoal)."""

import numpy as np
import torch
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class TorchScriptRuntime(MLModel):
    """Serves a TorchScript file (the same model.pt shoal serves), one intra-op thread."""

    async def load(self) -> bool:
        torch.set_num_threads(1)
        self._module = torch.jit.load(self.settings.parameters.uri)
        self._module.eval()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        with torch.inference_mode():
            y = self._module(torch.from_numpy(np.ascontiguousarray(x))).numpy()
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output("OUTPUT__0", y)])


class TorchScriptDefaultRuntime(MLModel):
    """Serves a TorchScript file as a user would write the runtime: no thread settings, so torch
    in MLServer's inference worker process (parallel_workers 1 by default; MLServer sets no
    OMP/torch thread count) runs one intra-op thread per core."""

    async def load(self) -> bool:
        self._module = torch.jit.load(self.settings.parameters.uri)
        self._module.eval()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        with torch.inference_mode():
            y = self._module(torch.from_numpy(np.ascontiguousarray(x))).numpy()
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output("OUTPUT__0", y)])


class IdentityRuntime(MLModel):
    """Per-request overhead: returns its input."""

    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output("OUTPUT0", x)])
