"""The ``python`` backend: runs a Triton python_backend ``model.py`` unchanged, in-process.

One ``PythonBackend`` per worker process (one model instance). ``load`` imports the model file
(see ``loader``), instantiates ``TritonPythonModel`` and calls ``initialize(args)`` with Triton's
keys; ``execute`` wraps each request as ``pb_utils.InferenceRequest`` over the request's numpy
arrays (no copy), calls the model's ``execute`` (an ``async def execute`` runs on a private
event loop thread, as Triton's stub does: waited for, except a decoupled model's, which runs in
the background while the instance takes its next requests), and turns each
``InferenceResponse`` into a ``BackendResponse`` or an ``Error``. An exception raised by the
model fails every request of the batch with an ``Error`` carrying the exception text (the
traceback goes to the log only).

Decoupled models answer through ``request.get_response_sender()`` (any thread, any time until
FINAL); the worker streams each response out as it is sent. ``request.is_cancelled()`` reads the
worker's cancellation flags. BLS (``InferenceRequest(...).exec()`` / ``async_exec()``) and model
control go through ``ctx.bls`` (``pb_bls``): model control from ``initialize`` on, BLS inference
from the end of ``initialize`` until ``finalize``. A request released with
``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` (iterative sequence models) is answered
``RESCHEDULED``: the broker runs it again (``broker/schedulers/iterative.py``).

A config ``reshape`` is applied as Triton's core applies it (``backends/reshape.py``): inputs
reach ``execute`` in their reshape shape, outputs leave in their ``dims`` shape.

Ragged batching needs nothing here, as in Triton's python backend: every request reaches the
model with its own inputs in their own shapes (``allow_ragged_batch`` only lets the broker batch
them together), and ``batch_input`` / ``batch_output`` are ignored — Triton's python backend never
builds batch input tensors (it hands the stub each request's own inputs) nor scatters outputs.

Its parts (docs/architecture.md §7): ``async_runner`` (the model's event loop), ``decoupled``
(a decoupled execute), ``returned`` (what execute gave back, judged as Triton's stub does),
``responses`` (``InferenceResponse`` -> ``BackendResponse``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

from shoal.dtypes import numpy_to_wire
from shoal.errors import ErrorCode, ShoalError
from shoal.messages import Error
from shoal.workers.backends.base import (
    RESCHEDULED,
    Answer,
    BackendRequest,
    CancelProbe,
    InstanceContext,
    Rescheduled,
    ResponseSink,
)
from shoal.workers.backends.python import c_utils, pb_bls, pb_utils
from shoal.workers.backends.python.async_runner import AsyncRunner
from shoal.workers.backends.python.decoupled import execute_decoupled
from shoal.workers.backends.python.loader import import_model_file
from shoal.workers.backends.python.pb_request import InferenceRequest, InferenceResponse
from shoal.workers.backends.python.pb_tensor import Tensor
from shoal.workers.backends.python.responses import ResponseConverter
from shoal.workers.backends.python.returned import check_returned, execute_failed
from shoal.workers.backends.reshape import reshapes, to_model
from shoal.workers.backends.torch_threads import apply_intra_op_threads
from shoal.workers.backends.torchscript_io import IoSpec

logger = logging.getLogger(__name__)

DEFAULT_MODEL_FILENAME = "model.py"


class PythonBackend:
    def __init__(self, model_path: str | None = None) -> None:
        """``model_path`` overrides ``<version_dir>/<default_model_filename>`` (used for
        Triton-style python-based backends living in the backend directory)."""
        self._model_path_override = model_path
        self._model: Any = None
        self._instance_name = ""
        self._all_outputs: list[str] = []
        self._input_reshapes: dict[str, IoSpec] = {}  # config inputs with a ``reshape``
        self._responses = ResponseConverter()
        self._batching = False
        self._runner = AsyncRunner()
        self._decoupled = False
        self._iterative = False  # sequence_batching { iterative_sequence: true }
        self._send_response: ResponseSink | None = None
        self._is_cancelled: CancelProbe | None = None

    def load(self, ctx: InstanceContext) -> None:
        config = ctx.config
        self._decoupled = bool(config.model_transaction_policy.decoupled)
        self._iterative = (config.HasField("sequence_batching")
                           and bool(config.sequence_batching.iterative_sequence))
        if self._decoupled and ctx.send_response is None:
            raise ShoalError(ErrorCode.UNSUPPORTED,
                             f"model '{ctx.model_name}' is decoupled but this worker cannot "
                             "stream responses")
        self._send_response = ctx.send_response
        self._is_cancelled = ctx.is_cancelled
        self._instance_name = ctx.instance_name
        self._all_outputs = [o.name for o in config.output]
        self._input_reshapes = reshapes(config.input)
        self._responses = ResponseConverter.for_config(config, ctx.instance_name)
        self._batching = config.max_batch_size > 0
        if "EXECUTION_ENV_PATH" in config.parameters:
            logger.warning("model instance '%s': parameters['EXECUTION_ENV_PATH'] is not "
                           "served: the model runs in the server's Python environment, not in "
                           "%s", ctx.instance_name,
                           config.parameters["EXECUTION_ENV_PATH"].string_value)
        path = self._model_path_override or os.path.join(
            ctx.version_dir, config.default_model_filename or DEFAULT_MODEL_FILENAME)
        # the model sees the command line of Triton's stub (an embedded interpreter: ['']),
        # not the worker's spec: QA models run ``unittest.main("model", exit=False)``, which
        # reads sys.argv[1:] as the names of the tests to run
        sys.argv = [""]
        module = import_model_file(path)
        model_class = getattr(module, "TritonPythonModel", None)
        if model_class is None:
            raise ShoalError(ErrorCode.INVALID_ARG,
                             f"python model file '{os.path.basename(path)}' of model "
                             f"'{ctx.model_name}' does not define class TritonPythonModel")
        # the version directory, also for a python-based backend whose model.py lives in the
        # backend directory (Triton's stub: the directory of <version_dir>/model.py)
        pb_utils.set_model_dir(os.path.abspath(ctx.version_dir))
        c_utils.set_free_memory_probe(ctx.shm_free_bytes)
        self._model = model_class()
        if not hasattr(self._model, "execute"):
            raise ShoalError(ErrorCode.INVALID_ARG,
                             f"python model '{ctx.model_name}' does not implement `execute`")
        pb_bls.attach(ctx.bls)
        _apply_thread_policy(ctx)  # before initialize: the model may set its own count there
        initialize = getattr(self._model, "initialize", None)
        if initialize is not None:
            self._await_if_needed(initialize(_initialize_args(ctx)))
        pb_bls.open_execution()

    def execute(self, requests: list[BackendRequest]) -> list[Answer]:
        if not requests:
            return []
        pb_requests = [self._wrap_request(r) for r in requests]
        if self._decoupled:
            errors = execute_decoupled(self._model, requests, pb_requests, runner=self._runner,
                                       sink=self._send_response, instance=self._instance_name)
            return [self._rescheduling(p) if error is None else error
                    for p, error in zip(pb_requests, errors, strict=True)]
        try:
            returned = self._await_if_needed(self._model.execute(pb_requests))
            responses = check_returned(pb_requests, returned, self._instance_name)
        except Exception as exc:
            error = execute_failed(self._instance_name, exc, len(requests))
            # a response already sent through the request's sender stands (Triton's stub had
            # delivered it at send; the error that followed is dropped for that request)
            return [error if p.sent_response is None else self._responses.convert(
                p.sent_response, r) for p, r in zip(pb_requests, requests, strict=True)]
        answers: list[Answer] = []
        for response, pb_request, request in zip(responses, pb_requests, requests,
                                                 strict=True):
            rescheduling = self._rescheduling(pb_request)
            if rescheduling is not None:
                answers.append(rescheduling)
                continue
            # None: its sender answers after execute returned
            answer = self._await_sender(pb_request) if response is None else response
            answers.append(answer if isinstance(answer, Error)
                           else self._responses.convert(answer, request))
        return answers

    def _rescheduling(self, pb_request: InferenceRequest) -> Rescheduled | Error | None:
        """The model released this request with RESCHEDULE: run it again (an iterative
        sequence model) or an Error (any other model; Triton's core cannot reschedule it
        either); None if it did not, or if its stream has ended (a decoupled FINAL was sent)."""
        if not pb_request.release_rescheduled():
            return None
        if pb_request._sender is not None and pb_request._sender.closed:
            return None
        if self._iterative:
            return RESCHEDULED
        return Error(ErrorCode.INVALID_ARG,
                     f"model instance '{self._instance_name}' released a request with "
                     "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, which needs "
                     "sequence_batching { iterative_sequence: true } in the model's config")

    def _await_sender(self, pb_request: InferenceRequest) -> InferenceResponse | Error:
        """A non-decoupled request that execute returned None for while its sender is open:
        its response comes from the model's own thread or task later (Triton's stub lets it;
        the request completes when FINAL is sent). Waits for it, or for the client to cancel."""
        sender = pb_request.get_response_sender()
        while not sender.wait_closed(0.1):
            if pb_request.is_cancelled():
                return Error(ErrorCode.CANCELLED, "request cancelled")
        response = sender.sent_response
        assert response is not None  # FINAL needs a response first (non-decoupled)
        return response

    def unload(self) -> None:
        pb_bls.detach()
        try:
            finalize = getattr(self._model, "finalize", None)
            if finalize is not None:
                self._await_if_needed(finalize())
        except Exception:
            logger.exception("finalize() of model instance '%s' raised", self._instance_name)
        finally:
            self._runner.close()
            self._model = None

    def is_ready(self) -> bool:
        """The model's own ``is_ready()`` when it defines one (sync or async), else loaded."""
        if self._model is None:
            return False
        check = getattr(self._model, "is_ready", None)
        if check is None:
            return True
        try:
            return bool(self._await_if_needed(check()))
        except Exception:
            logger.exception("is_ready() of model instance '%s' raised", self._instance_name)
            return False

    def _await_if_needed(self, result: Any) -> Any:
        if asyncio.iscoroutine(result):
            return self._runner.run(result)
        return result

    def _wrap_request(self, request: BackendRequest) -> InferenceRequest:
        inputs = request.inputs
        if self._input_reshapes:  # the model sees each such input in its reshape shape
            inputs = {name: to_model(array, self._input_reshapes[name], self._batching)
                      if name in self._input_reshapes else array
                      for name, array in inputs.items()}
        tensors = [Tensor._wrap(name, array,
                                request.input_datatypes.get(name) or numpy_to_wire(array.dtype))
                   for name, array in inputs.items()]
        requested = list(request.requested_outputs or self._all_outputs)
        parameters = dict(request.parameters) if request.parameters else None
        pb_request = InferenceRequest(
            request_id=request.client_request_id, correlation_id=request.correlation_id,
            inputs=tensors, requested_output_names=requested, model_name="",
            flags=request.flags, parameters=parameters)
        probe = self._is_cancelled
        if probe is not None:
            pb_request._cancelled = lambda: probe(request.request_id)
        if self._decoupled and self._send_response is not None:
            sink = self._send_response

            def emit(response: InferenceResponse | None, final: bool) -> None:
                converted = None if response is None else self._responses.convert(response,
                                                                                  request)
                sink(request.request_id, converted, final)

            pb_request._emit = emit
        return pb_request


def _apply_thread_policy(ctx: InstanceContext) -> None:
    """A model file that imported torch gets torch's intra-op threads as a pytorch model would
    (``torch_threads.py``: its INTRA_OP_THREAD_COUNT parameter, else the server's policy); one
    that did not is left alone (importing torch here would cost every python model ~1 s)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    params = {key: value.string_value for key, value in ctx.config.parameters.items()}
    threads = apply_intra_op_threads(torch, params, ctx.backend_settings,
                                     ctx.default_intra_op_threads)
    logger.info("python instance '%s' (imports torch): %d intra-op thread(s)",
                ctx.instance_name, threads)


def _initialize_args(ctx: InstanceContext) -> dict[str, str]:
    return {
        "model_config": ctx.config_json,
        "model_instance_kind": ctx.kind,
        "model_instance_name": ctx.instance_name,
        "model_instance_device_id": str(ctx.device_id),
        "model_repository": ctx.model_dir,
        "model_version": str(ctx.model_version),
        "model_name": ctx.model_name,
    }
