"""The ``fil`` backend class (see the package docstring and ``shoal/workers/backends/base.py``).

Load: the FIL parameters (``params``), then ``<version_dir>/<default_model_filename or the
model_type's file>`` with its library (``forest``); the config must batch (``max_batch_size >
0``, as Triton's FIL backend requires) and have one FP32 input ``input__0`` of dims
``[num_features]`` and one FP32 output ``output__0`` whose width fits the parameters
(``outputs.output_width``).

Execute: the requests of a batch run as one prediction (their rows joined, zero-copy when they
lie back to back in shared memory) and ``output__0`` is split back by each request's rows.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shoal.errors import ErrorCode, ShoalError, invalid_arg
from shoal.messages import Error
from shoal.workers.backends.base import (
    BackendRequest,
    BackendResponse,
    InstanceContext,
    OutputTensor,
)
from shoal.workers.backends.fil.forest import Forest, load_forest
from shoal.workers.backends.fil.outputs import fil_output, output_width
from shoal.workers.backends.fil.params import (
    INPUT_NAME,
    OUTPUT_NAME,
    FilParams,
    config_parameters,
    default_threads,
    parse_params,
)
from shoal.workers.backends.torchscript_io import io_spec
from shoal.workers.batch_assembly import concat_rows, split_rows

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

logger = logging.getLogger(__name__)

Array = npt.NDArray[Any]


class FilBackend:
    def __init__(self) -> None:
        self._name = ""
        self._max_batch = 0
        self._params: FilParams | None = None
        self._forest: Forest | None = None
        self._width = 1

    def load(self, ctx: InstanceContext) -> None:
        config = ctx.config
        model = ctx.model_name
        self._name = ctx.instance_name
        params = parse_params(model, config_parameters(config))
        self._max_batch = int(config.max_batch_size)
        if self._max_batch <= 0:
            raise invalid_arg(f"model '{model}': the fil backend needs batching: set "
                              "'max_batch_size' above 0")
        filename = config.default_model_filename or params.default_filename
        path = os.path.join(ctx.version_dir, filename)
        if not os.path.isfile(path):
            raise invalid_arg(f"model '{model}' version {ctx.model_version}: model file "
                              f"'{filename}' for model_type '{params.model_type}' not found")
        threads = params.thread_count or default_threads(config)
        forest = load_forest(params.model_type, path, threads=threads,
                             allow_unknown_field=params.xgboost_allow_unknown_field)
        self._width = _check_config(model, config, params, forest)
        self._params = params
        self._forest = forest
        logger.info("fil instance '%s': %s model '%s', %d features, %d score(s) per row, "
                    "%d thread(s)", self._name, params.model_type, filename,
                    forest.num_features, forest.num_class, threads)

    def execute(self, requests: list[BackendRequest]) -> list[BackendResponse | Error | None]:
        assert self._forest is not None and self._params is not None, "execute() before load()"
        results: list[BackendResponse | Error | None] = [self._check(r) for r in requests]
        runnable = [i for i, problem in enumerate(results) if problem is None]
        if not runnable:
            return results
        batch = [requests[i] for i in runnable]
        try:
            outcome = self._run(batch)
        except ShoalError as exc:
            outcome = [Error(exc.code, exc.message)] * len(batch)
        except Exception as exc:
            logger.exception("fil instance '%s' failed on %d request(s)", self._name, len(batch))
            outcome = [Error(ErrorCode.INTERNAL, f"fil execute failure: {exc}")] * len(batch)
        for index, result in zip(runnable, outcome, strict=True):
            results[index] = result
        return results

    def unload(self) -> None:
        self._forest = None

    def _check(self, request: BackendRequest) -> Error | None:
        assert self._forest is not None
        rows = request.inputs.get(INPUT_NAME)
        if rows is None:
            return Error(ErrorCode.INVALID_ARG, f"input '{INPUT_NAME}' is missing")
        expected = [request.batch_size, self._forest.num_features]
        if list(rows.shape) != expected or rows.dtype != np.float32:
            return Error(ErrorCode.INVALID_ARG,
                         f"input '{INPUT_NAME}' has shape {list(rows.shape)} and type "
                         f"{rows.dtype}, expected {expected} float32")
        return None

    def _run(self, batch: list[BackendRequest]) -> list[BackendResponse | Error]:
        assert self._forest is not None and self._params is not None
        sizes = [request.batch_size for request in batch]
        if sum(sizes) > self._max_batch:
            raise ShoalError(ErrorCode.INTERNAL, f"batch size {sum(sizes)} for '{self._name}', "
                                                 f"max allowed is {self._max_batch}")
        rows = concat_rows([request.inputs[INPUT_NAME] for request in batch])
        scores = self._forest.predict(rows)
        output = np.ascontiguousarray(fil_output(self._params, scores, self._width))
        return [BackendResponse(outputs=[OutputTensor(OUTPUT_NAME, "FP32", part)])
                for part in split_rows(output, sizes)]


def _check_config(model: str, config: ModelConfig, params: FilParams, forest: Forest) -> int:
    """The config's input and output against the model (Triton FIL's names and FP32 only);
    the width of ``output__0``. Raises INVALID_ARG naming the tensor."""
    inputs = [io_spec(io) for io in config.input]
    outputs = [io_spec(io) for io in config.output]
    if [spec.name for spec in inputs] != [INPUT_NAME]:
        raise invalid_arg(f"model '{model}': the fil backend takes one input named "
                          f"'{INPUT_NAME}', the config has {[spec.name for spec in inputs]}")
    if [spec.name for spec in outputs] != [OUTPUT_NAME]:
        raise invalid_arg(f"model '{model}': the fil backend gives one output named "
                          f"'{OUTPUT_NAME}', the config has {[spec.name for spec in outputs]}")
    source, target = inputs[0], outputs[0]
    for spec in (source, target):
        if spec.datatype != "FP32" or spec.reshape is not None:
            raise invalid_arg(f"model '{model}': tensor '{spec.name}' must be TYPE_FP32 "
                              "without reshape for the fil backend")
    if list(source.dims) != [forest.num_features]:
        raise invalid_arg(f"model '{model}': input '{INPUT_NAME}' has dims "
                          f"{list(source.dims)}, the model takes [{forest.num_features}] "
                          "features")
    if len(target.dims) != 1:
        raise invalid_arg(f"model '{model}': output '{OUTPUT_NAME}' has dims "
                          f"{list(target.dims)}, expected one dim")
    try:
        return output_width(params, forest.num_class, int(target.dims[0]))
    except ShoalError as exc:
        raise invalid_arg(f"model '{model}': {exc.message}") from None
