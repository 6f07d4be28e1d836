"""The ``identity`` backend, as Triton's identity backend that Triton's QA models name
(``backend: "identity"``): no model file; each input ``INPUT<n>`` comes back unchanged as the
output ``OUTPUT<n>``, with its shape and datatype.

Load checks the config: every input needs its output of the same datatype (a model that cannot
answer would otherwise fail each request). Model parameter ``execute_delay_ms`` (Triton's
knob for tests of slow models) sleeps that long per execution. Threads: the worker's main
thread only (backend contract).
"""

from __future__ import annotations

import time
from typing import Any

from tritonclient.grpc import model_config_pb2 as pb

from shoal.dtypes import config_to_wire
from shoal.errors import invalid_arg
from shoal.messages import Error
from shoal.workers.backends.base import (
    BackendRequest,
    BackendResponse,
    InstanceContext,
    OutputTensor,
)

INPUT_PREFIX = "INPUT"
OUTPUT_PREFIX = "OUTPUT"


def output_name(input_name: str) -> str:
    """``INPUT<n>`` -> ``OUTPUT<n>``."""
    return OUTPUT_PREFIX + input_name[len(INPUT_PREFIX):]


def _datatypes(ios: Any) -> dict[str, str]:
    return {io.name: config_to_wire(pb.DataType.Name(io.data_type)) for io in ios}


class IdentityBackend:
    def __init__(self) -> None:
        self._outputs: dict[str, str] = {}  # input name -> output name
        self._delay_s = 0.0

    def load(self, ctx: InstanceContext) -> None:
        inputs, outputs = _datatypes(ctx.config.input), _datatypes(ctx.config.output)
        for name, datatype in inputs.items():
            if not name.startswith(INPUT_PREFIX):
                raise invalid_arg(f"identity backend: input '{name}' of model "
                                  f"'{ctx.model_name}' is not named {INPUT_PREFIX}<n>")
            wanted = output_name(name)
            if outputs.get(wanted) != datatype:
                raise invalid_arg(f"identity backend: input '{name}' of model "
                                  f"'{ctx.model_name}' needs an output '{wanted}' of "
                                  f"datatype {datatype}")
            self._outputs[name] = wanted
        delay = ctx.config.parameters.get("execute_delay_ms")
        if delay is not None and delay.string_value:
            try:
                self._delay_s = max(0.0, float(delay.string_value)) / 1000
            except ValueError:
                raise invalid_arg("identity backend: parameter execute_delay_ms must be a "
                                  f"number, got '{delay.string_value}'") from None

    def execute(self, requests: list[BackendRequest]) -> list[BackendResponse | Error | None]:
        # the outputs alias the inputs, no copy: the worker copies every output into its own
        # memory before the request's inputs are released (as for a python identity model)
        if self._delay_s:
            time.sleep(self._delay_s)
        return [BackendResponse([OutputTensor(self._outputs[name], r.input_datatypes[name],
                                              array)
                                 for name, array in r.inputs.items() if name in self._outputs])
                for r in requests]

    def unload(self) -> None:
        self._outputs.clear()
