import numpy as np
import triton_python_backend_utils as pb_utils

MODE = "accumulate"


def _flag(request, name, rows):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return np.zeros((rows, 1), dtype=np.int32)
    return tensor.as_numpy().reshape(rows, -1).astype(np.int32)


def _corrid(request):
    tensor = pb_utils.get_input_tensor_by_name(request, "CORRID")
    if tensor is not None:
        value = tensor.as_numpy().flatten()[0]
        return int(value.decode() if isinstance(value, bytes) else value)
    cid = request.correlation_id()
    return int(cid)


class TritonPythonModel:
    def initialize(self, args):
        self.acc = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            rows = value.shape[0]
            start = _flag(request, "START", rows)
            end = _flag(request, "END", rows)
            v = value.reshape(rows, -1).astype(np.int64)
            if MODE == "accumulate":
                key = request.correlation_id()
                previous = self.acc.get(key, np.zeros_like(v))
                out = np.where(start != 0, v, previous + v)
                self.acc[key] = out
            else:
                out = v + start
            if MODE in ("dyna", "accumulate") and end.any():
                out = out + np.where(end != 0, _corrid(request), 0)
                if MODE == "accumulate":
                    self.acc.pop(request.correlation_id(), None)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT", out.astype(np.int32).reshape(value.shape))]))
        return responses
