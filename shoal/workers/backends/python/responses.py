"""A python model's ``InferenceResponse`` -> the worker's ``BackendResponse`` or ``Error``
(docs/architecture.md §7, the python backend).

``ResponseConverter`` (one per model instance, built from its config at load):
- an error response becomes an ``Error`` with ``in_response`` set (the model answered: Triton
  counts the request a success), its code kept when it is one of shoal's, else INTERNAL;
- outputs the request did not ask for are left out (every output when it asked for none);
  an output the config ``reshape``s leaves in its ``dims`` shape (``backends/reshape.py``);
- an output's datatype is the config's when it fits the tensor (BF16 over uint16), else the
  tensor's own (what Triton sends; a mismatch is logged once per output);
- response parameters (a JSON object string) become a dict.
No copy of an output that aliases an input: the worker copies every output into shared
memory before the request's inputs are released.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from shoal.dtypes import config_to_wire
from shoal.errors import ErrorCode
from shoal.messages import Error
from shoal.workers.backends.base import BackendRequest, BackendResponse, OutputTensor
from shoal.workers.backends.python.pb_request import InferenceResponse
from shoal.workers.backends.python.pb_tensor import TRITON_TO_WIRE, Tensor, host_array
from shoal.workers.backends.reshape import reshapes, to_client
from shoal.workers.backends.torchscript_io import IoSpec

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

logger = logging.getLogger(__name__)


class ResponseConverter:
    def __init__(self, instance_name: str = "", output_datatypes: dict[str, str] | None = None,
                 output_reshapes: dict[str, IoSpec] | None = None,
                 batching: bool = False) -> None:
        self._instance_name = instance_name
        self._output_datatypes = output_datatypes or {}
        self._output_reshapes = output_reshapes or {}  # config outputs with a ``reshape``
        self._batching = batching
        self._warned_dtype: set[str] = set()

    @classmethod
    def for_config(cls, config: ModelConfig, instance_name: str) -> ResponseConverter:
        """For a ``model_config_pb2.ModelConfig``'s outputs."""
        datatypes = {o.name: config_to_wire(_type_name(o.data_type))
                     for o in config.output if o.data_type != 0}
        return cls(instance_name, datatypes, reshapes(config.output), config.max_batch_size > 0)

    def convert(self, response: InferenceResponse,
                request: BackendRequest) -> BackendResponse | Error:
        error = response.error()
        if error is not None:
            code = error.code()
            known = code in ErrorCode._value2member_map_
            # the model answered with an error: the request itself succeeded (Triton's count)
            return Error(ErrorCode(code) if known else ErrorCode.INTERNAL, error.message(),
                         in_response=True)
        wanted = set(request.requested_outputs)
        outputs: list[OutputTensor] = []
        for tensor in response.output_tensors():
            name = tensor.name()
            if wanted and name not in wanted:
                continue
            # No defensive copy when the output aliases an input (an identity model): the worker
            # copies every output into shared memory before the request's inputs are released
            # (batch results before the BatchResult, streamed ones inside send()).
            array = host_array(tensor)
            reshape = self._output_reshapes.get(name)
            if reshape is not None:  # produced in its reshape shape, answered in its dims
                array = to_client(array, reshape, self._batching)
            outputs.append(OutputTensor(name, self._output_datatype(tensor), array))
        parameters = _json_params(response.parameters())
        return BackendResponse(outputs=outputs, parameters=parameters)

    def _output_datatype(self, tensor: Tensor) -> str:
        """The config's data_type when it fits the tensor (e.g. BF16 over uint16), else the
        tensor's own type (what Triton sends)."""
        native = TRITON_TO_WIRE[tensor.triton_dtype()]
        declared = self._output_datatypes.get(tensor.name())
        if declared is None or declared == native:
            return native
        if declared == "BF16" and native == "UINT16":
            return declared
        if tensor.name() not in self._warned_dtype:
            self._warned_dtype.add(tensor.name())
            logger.warning("model instance '%s' returns output '%s' as %s, config declares %s",
                           self._instance_name, tensor.name(), native, declared)
        return native


def _type_name(data_type: int) -> str:
    from tritonclient.grpc import model_config_pb2

    # ValueType: int at run time, the enum's NewType in the stub (typings/)
    return str(model_config_pb2.DataType.Name(model_config_pb2.DataType.ValueType(data_type)))


def _json_params(text: str) -> dict[str, Any]:
    loaded = json.loads(text) if text else {}
    return loaded if isinstance(loaded, dict) else {}
