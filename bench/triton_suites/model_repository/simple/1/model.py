import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (strings parsed as integers)."""

    def initialize(self, args):
        self.strings = "no" == "yes"

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if self.strings:
                ia, ib = a.astype(np.int64), b.astype(np.int64)
                out0 = np.array([str(v).encode() for v in (ia + ib).flat],
                                dtype=np.object_).reshape(a.shape)
                out1 = np.array([str(v).encode() for v in (ia - ib).flat],
                                dtype=np.object_).reshape(a.shape)
            else:
                out0, out1 = (a + b).astype(a.dtype), (a - b).astype(a.dtype)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", out0), pb_utils.Tensor("OUTPUT1", out1)]))
        return responses
