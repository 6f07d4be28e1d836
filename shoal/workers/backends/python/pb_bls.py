"""BLS and model control for ``pb_utils``: ``InferenceRequest.exec`` / ``async_exec``,
``ResponseIterator``, ``load_model`` / ``unload_model`` / ``is_model_ready``, over the worker's
``BlsClient`` (``shoal.workers.bls``).

One model instance per process, so the client is process state: the python backend ``attach``es
it before ``initialize`` (model control is allowed from there), ``open_execution`` after it
(BLS inference is allowed from then on, as in Triton: "BLS is only supported during the
'execute' function", i.e. not in initialize or finalize), and ``detach``es it before
``finalize``.

Output tensors of a BLS response are views of the callee's shared memory (``Tensor.as_numpy()``
is not a copy); the memory goes back to the callee when the last view is gone.

Threads: any (the main thread inside ``execute``, the backend's event-loop thread, threads a
decoupled model starts); the client serializes what needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import TYPE_CHECKING, Any

from shoal.config.load_overrides import (
    CONFIG_PARAMETER,
    FILE_PARAMETER_PREFIX,
    check_load_parameters,
    shown,
)
from shoal.errors import ShoalError, invalid_arg
from shoal.workers.backends.python.pb_request import (
    InferenceRequest,
    InferenceResponse,
    TritonError,
    install_bls,
    text_argument,
)
from shoal.workers.backends.python.pb_tensor import (
    TRITON_TO_WIRE,
    Tensor,
    TritonModelException,
    host_array,
)
from shoal.workers.bls.memory import BlsAnswer
from shoal.workers.bls.requests import BlsCall, BlsInput

if TYPE_CHECKING:
    from shoal.workers.bls.client import BlsClient, BlsStream

_client: BlsClient | None = None
_executing = False


def attach(client: BlsClient | None) -> None:
    """Model control available (from ``initialize`` on); BLS inference not yet."""
    global _client, _executing
    _client, _executing = client, False


def open_execution() -> None:
    global _executing
    _executing = _client is not None


def detach() -> None:
    """Before ``finalize``: neither BLS nor model control any more."""
    attach(None)


def _inference_client() -> BlsClient:
    if _client is None or not _executing:
        raise TritonModelException("BLS is only supported during the 'execute' function.")
    return _client


def _control_client(action: str) -> BlsClient:
    if _client is None:
        raise TritonModelException(f"Failed to {action}: model control is only supported "
                                   "while the model is loaded (initialize and execute)")
    return _client


# ---------------------------------------------------------------------- inference


def execute(request: InferenceRequest, decoupled: bool) -> InferenceResponse | ResponseIterator:
    """``request.exec(decoupled)``: the response (errors inside it), or an iterator of them."""
    client = _inference_client()
    call = call_of(request, decoupled)
    if decoupled:
        return ResponseIterator(client.stream(call))
    return response_of(client.call(call))


def async_execute(request: InferenceRequest, decoupled: bool) -> asyncio.Future[Any]:
    """``request.async_exec(decoupled)``: a future on the running loop (RuntimeError without
    one, as in Triton). Non-decoupled calls wait on the loop itself (no thread per call)."""
    loop = asyncio.get_running_loop()
    client = _inference_client()
    call = call_of(request, decoupled)
    if decoupled:  # Triton resolves it once the first answer is in: that wait needs a thread
        return loop.run_in_executor(None, lambda: _first_answered(client.stream(call)))
    answer = client.call_async(call)
    response: asyncio.Future[InferenceResponse] = loop.create_future()

    def convert(done: asyncio.Future[BlsAnswer]) -> None:
        if response.done():
            return
        if done.cancelled():
            response.cancel()
        else:
            response.set_result(response_of(done.result()))

    answer.add_done_callback(convert)
    response.add_done_callback(lambda f: answer.cancel() if f.cancelled() else None)
    return response


def _first_answered(stream: BlsStream) -> ResponseIterator:
    iterator = ResponseIterator(stream)
    iterator._receive()
    return iterator


def call_of(request: InferenceRequest, decoupled: bool) -> BlsCall:
    """The BLS call a ``pb_utils.InferenceRequest`` describes (inputs as host arrays)."""
    if not isinstance(decoupled, bool):
        raise TypeError("exec(): 'decoupled' must be a bool")
    inputs: list[BlsInput] = []
    for tensor in request.inputs():
        if not isinstance(tensor, Tensor):
            raise TritonModelException(
                f"InferenceRequest inputs must be pb_utils.Tensor objects, found {type(tensor)}")
        inputs.append(BlsInput(tensor.name(), TRITON_TO_WIRE[tensor.triton_dtype()],
                               tensor.shape(), host_array(tensor)))
    parameters = json.loads(request.parameters() or "{}")
    return BlsCall(
        model=request.model_name, inputs=inputs,  # InferenceRequest() made it text
        outputs=list(dict.fromkeys(request.requested_output_names())),  # a set, as in Triton
        version=int(request.model_version),
        request_id=request.request_id(), correlation_id=request.correlation_id(),
        flags=request.flags(), timeout_us=int(request.timeout()),
        parameters=parameters if isinstance(parameters, dict) else {}, decoupled=decoupled)


def response_of(answer: BlsAnswer) -> InferenceResponse:
    if answer.error is not None:
        return InferenceResponse(error=TritonError(answer.error.message, int(answer.error.code)))
    tensors = [Tensor._wrap(output.name, output.array, output.datatype)
               for output in answer.outputs]
    return InferenceResponse(tensors, parameters=answer.parameters)


class ResponseIterator:
    """``pb_utils.ResponseIterator``: the responses of ``exec(decoupled=True)``, the last one
    included (a decoupled callee's last response may have no outputs). ``next`` blocks until the
    next response. Once finished, iterating again starts over from the first response (Triton).
    ``cancel()`` asks the callee to stop; dropping an unfinished iterator cancels the request
    and gives the memory of its later responses back (Triton waits for them instead)."""

    def __init__(self, stream: BlsStream) -> None:
        self._stream = stream
        self._responses: list[InferenceResponse] = []  # kept, as Triton keeps them
        self._index = 0  # of the next response to return
        self._finished = False

    def _receive(self) -> None:
        answer = self._stream.next()
        self._responses.append(response_of(answer))
        self._finished = answer.final

    def __iter__(self) -> ResponseIterator:
        if self._finished and self._index >= len(self._responses):
            self._index = 0
        return self

    def __next__(self) -> InferenceResponse:
        if self._index >= len(self._responses):
            if self._finished:
                raise StopIteration
            self._receive()
        self._index += 1
        return self._responses[self._index - 1]

    def cancel(self) -> None:
        self._stream.cancel()

    def __del__(self) -> None:
        if not self._finished:
            with contextlib.suppress(Exception):
                self._stream.abandon()


# ---------------------------------------------------------------------- model control


def load_model(model_name: str | bytes, config: str = "", files: Any = None) -> None:
    """Returns once the model is ready; TritonModelException with the reason otherwise."""
    model_name = text_argument(model_name, "load_model(): model_name")
    if not isinstance(config, str):
        raise TypeError("load_model(): model_name and config must be strings")
    if files is not None and (not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, bytes | bytearray) for k, v in files.items())):
        raise TritonModelException(
            f"failed to load model '{model_name}', files should be a dictionary of file paths "
            "and file contents")
    client = _control_client("load model")
    try:
        file_map = checked_files(model_name, config, files or {})
        client.load_model(model_name, config, file_map)
    except ShoalError as exc:
        raise TritonModelException(f"Failed to load model: {exc.message}") from None


def checked_files(model_name: str, config: str, files: dict[str, bytes]) -> dict[str, bytes]:
    """``load_model``'s overrides, checked here as the frontend checks an HTTP load (the broker
    checks them again before anything touches disk); keys stay ``file:<version>/<path>``."""
    for key in files:
        if not key.startswith(FILE_PARAMETER_PREFIX):
            raise invalid_arg(f"failed to load '{shown(model_name)}': files: '{shown(key)}' "
                              f"does not start with '{FILE_PARAMETER_PREFIX}'")
    parameters: dict[str, str | bytes] = {CONFIG_PARAMETER: config}
    parameters.update((key, bytes(data)) for key, data in files.items())
    overrides = check_load_parameters(model_name, parameters)
    return {f"{FILE_PARAMETER_PREFIX}{path}": data for path, data in overrides.files.items()}


def unload_model(model_name: str | bytes, unload_dependents: bool = False) -> None:
    model_name = text_argument(model_name, "unload_model(): model_name")
    client = _control_client("unload model")
    try:
        client.unload_model(model_name, bool(unload_dependents))
    except ShoalError as exc:
        raise TritonModelException(f"Failed to unload model: {exc.message}") from None


def is_model_ready(model_name: str | bytes, model_version: str = "") -> bool:
    model_name = text_argument(model_name, "is_model_ready(): model_name")
    client = _control_client("check model readiness")
    try:
        return client.model_ready(model_name, str(model_version))
    except (ShoalError, ValueError) as exc:
        message = exc.message if isinstance(exc, ShoalError) else str(exc)
        raise TritonModelException(f"Failed to check model readiness: {message}") from None


install_bls(execute, async_execute)  # InferenceRequest.exec / async_exec run these
