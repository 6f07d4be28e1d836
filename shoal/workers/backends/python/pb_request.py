"""``pb_utils`` request / response / error types, with Triton python_backend semantics.

BLS: ``InferenceRequest(model_name=..., ...).exec()`` / ``async_exec()`` call another model of
the server through the runner ``pb_bls`` installs here when it is imported (``install_bls``: the
arrow runs from pb_bls to this module only). ``get_response_sender`` follows the
non-decoupled rules (exactly one response, then FINAL, before or after execute returns), or
streams each send out for decoupled models.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

from shoal.errors import ErrorCode
from shoal.workers.backends.python.pb_tensor import Tensor, TritonModelException

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_GPU = 0
TRITONSERVER_MEMORY_CPU = 1

BlsRun = Callable[["InferenceRequest", bool], Any]  # (request, decoupled) -> the answer
_bls_execute: BlsRun | None = None
_bls_async_execute: BlsRun | None = None


def install_bls(execute: BlsRun, async_execute: BlsRun) -> None:
    """``pb_bls`` at import: what ``exec`` / ``async_exec`` run."""
    global _bls_execute, _bls_async_execute
    _bls_execute, _bls_async_execute = execute, async_execute


class TritonError:
    """``pb_utils.TritonError(message, code=TritonError.INTERNAL)``."""

    UNKNOWN = int(ErrorCode.UNKNOWN)
    INTERNAL = int(ErrorCode.INTERNAL)
    NOT_FOUND = int(ErrorCode.NOT_FOUND)
    INVALID_ARG = int(ErrorCode.INVALID_ARG)
    UNAVAILABLE = int(ErrorCode.UNAVAILABLE)
    UNSUPPORTED = int(ErrorCode.UNSUPPORTED)
    ALREADY_EXISTS = int(ErrorCode.ALREADY_EXISTS)
    CANCELLED = int(ErrorCode.CANCELLED)

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        if message is None or code is None:
            raise TypeError("TritonError needs a message and a code")
        self._message = str(message)
        self._code = int(code)

    def code(self) -> int:
        return self._code

    def message(self) -> str:
        return self._message

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


class PreferredMemory:
    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    def get_context(self) -> str | None:
        return None


def parameters_to_json(parameters: Any) -> str:
    """Triton's check: a dict of str -> bool/int/str (shoal also accepts float, as KServe does)."""
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        return parameters
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect dict, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, bool | int | str | float):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}")
    return json.dumps(parameters)


class InferenceResponse:
    """``pb_utils.InferenceResponse(output_tensors=[], error=None, parameters=None)``."""

    def __init__(self, output_tensors: Any = (), error: TritonError | None = None,
                 parameters: Any = None) -> None:
        if not isinstance(output_tensors, list | tuple):  # None too, as Triton's bindings
            raise TypeError("InferenceResponse(): output_tensors must be a list of "
                            f"pb_utils.Tensor, not {type(output_tensors).__name__}")
        tensors = list(output_tensors)
        for tensor in tensors:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"output_tensors must hold pb_utils.Tensor objects, found {type(tensor)}")
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException(f"error must be a pb_utils.TritonError, got {type(error)}")
        self._tensors: list[Tensor] = tensors
        self._error = error
        self._parameters_json = parameters_to_json(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return self._parameters_json


Emit = Callable[["InferenceResponse | None", bool], None]  # (response, final)
CancelledProbe = Callable[[], bool]


class InferenceResponseSender:
    """Non-decoupled rules: at most one response, and FINAL closes the sender. Decoupled
    (``emit`` given): every ``send`` goes out at once, from any thread; FINAL closes it."""

    def __init__(self, emit: Emit | None = None, cancelled: CancelledProbe | None = None
                 ) -> None:
        self._response: InferenceResponse | None = None
        self._closed = False
        self._done = threading.Event()  # set with FINAL (``wait_closed``)
        self._emit = emit
        self._cancelled = cancelled

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self._closed:
            raise TritonModelException(
                "Unable to send response. Response sender has been closed.")
        if self._emit is not None:
            if response is not None and not isinstance(response, InferenceResponse):
                raise TritonModelException(
                    f"send() expects a pb_utils.InferenceResponse, got {type(response)}")
            final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            if response is None and not final:
                return  # nothing to send (Triton ignores it too)
            if final:
                self._closed = True
            self._emit(response, final)
            return
        if response is not None:
            if not isinstance(response, InferenceResponse):
                raise TritonModelException(
                    f"send() expects a pb_utils.InferenceResponse, got {type(response)}")
            if self._response is not None:
                raise TritonModelException(
                    "Non-decoupled model cannot send more than one response.")
            self._response = response
        if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            if self._response is None:
                raise TritonModelException(
                    "Non-decoupled model cannot send complete final before sending a response.")
            self._closed = True
            self._done.set()

    def wait_closed(self, timeout: float) -> bool:
        """Non-decoupled: True once FINAL was sent (from any thread), waiting up to
        ``timeout`` s."""
        return self._done.wait(timeout)

    def is_cancelled(self) -> bool:
        return self._cancelled() if self._cancelled is not None else False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def sent_response(self) -> InferenceResponse | None:
        return self._response


def text_argument(value: Any, what: str) -> str:
    """A string argument of pb_utils as Triton's bindings take it (a C++ ``std::string``):
    ``str`` (numpy's ``str_`` too), or ``bytes`` / ``bytearray`` (numpy's ``bytes_``, e.g. an
    element of a BYTES input's array), read as UTF-8; anything else is a TypeError."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    raise TypeError(f"{what} must be a str or bytes, not {type(value).__name__}")


# the default of an argument Triton's bindings require (``InferenceRequest`` raises TypeError)
_REQUIRED: Any = object()


class InferenceRequest:
    """``pb_utils.InferenceRequest``: what ``execute`` receives (and the BLS constructor).
    ``model_name`` may be given as bytes (``text_argument``)."""

    def __init__(self, request_id: str = "", correlation_id: int | str = 0,
                 inputs: Sequence[Tensor] = _REQUIRED,
                 requested_output_names: Sequence[str] = _REQUIRED,
                 model_name: str | bytes = _REQUIRED,
                 model_version: int = -1, flags: int = 0, timeout: int = 0,
                 preferred_memory: PreferredMemory | None = None,
                 trace: InferenceTrace | None = None, parameters: Any = None) -> None:
        # inputs, requested_output_names and model_name have no default in Triton's bindings:
        # leaving one out is a TypeError (QA's bls test_bls_incorrect_args)
        for what, given in (("inputs", inputs), ("requested_output_names",
                                                 requested_output_names),
                            ("model_name", model_name)):
            if given is _REQUIRED:
                raise TypeError(f"InferenceRequest(): missing required argument '{what}'")
        if not isinstance(correlation_id, int | str):
            raise TypeError("InferenceRequest(): correlation_id must be an int or a str, not "
                            f"{type(correlation_id).__name__}")
        for what, value, kinds in (("request_id", request_id, str),
                                   ("model_version", model_version, int),
                                   ("flags", flags, int), ("timeout", timeout, int)):
            if not isinstance(value, kinds):
                raise TypeError(f"InferenceRequest(): {what} must be a {kinds.__name__}, not "
                                f"{type(value).__name__}")
        self._request_id = request_id
        self._correlation_id = correlation_id
        # None is a TypeError and a list holding anything but Tensors a TritonModelException,
        # as Triton's bindings (QA's argument_validation)
        for what, given in (("inputs", inputs),
                            ("requested_output_names", requested_output_names)):
            if not isinstance(given, list | tuple):
                raise TypeError(f"InferenceRequest(): {what} must be a list, not "
                                f"{type(given).__name__}")
        for name in requested_output_names:
            if not isinstance(name, str):
                raise TypeError("InferenceRequest(): requested_output_names must hold str, "
                                f"found {type(name).__name__}")
        for tensor in inputs:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    f"InferenceRequest(): inputs must hold pb_utils.Tensor objects, found "
                    f"{type(tensor)}")
        self._inputs: list[Tensor] = list(inputs)
        self._requested = list(requested_output_names)
        self.model_name = text_argument(model_name, "InferenceRequest(): model_name")
        self.model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._parameters_json = parameters_to_json(parameters)
        self._trace = trace or InferenceTrace()
        self._sender: InferenceResponseSender | None = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        # set by the python backend for requests it hands to a model (not for BLS requests)
        self._emit: Emit | None = None
        self._cancelled: CancelledProbe | None = None

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._requested

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters_json

    def trace(self) -> InferenceTrace:
        return self._trace

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            self._sender = InferenceResponseSender(self._emit, self._cancelled)
        return self._sender

    def is_cancelled(self) -> bool:
        return self._cancelled() if self._cancelled is not None else False

    def set_release_flags(self, flags: int) -> None:
        """``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``: when ``execute`` returns, the request
        is not answered but run again in a later batch (iterative sequence models; a
        non-decoupled model returns None for it)."""
        self._release_flags = flags

    def release_rescheduled(self) -> bool:
        """shoal's: whether the model set ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``."""
        return bool(self._release_flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)

    def exec(self, decoupled: bool = False) -> Any:
        """BLS: run this request on model ``model_name``. Returns the ``InferenceResponse``
        (a failure is ``response.has_error()``, never raised), or with ``decoupled=True`` a
        ``ResponseIterator`` of every response."""
        if _bls_execute is None:
            raise TritonModelException("BLS is not available outside a python model's worker")
        return _bls_execute(self, decoupled)

    def async_exec(self, decoupled: bool = False) -> Any:
        """``exec`` as an awaitable (from an ``async def execute``); several awaited together
        run concurrently."""
        if _bls_async_execute is None:
            raise TritonModelException("BLS is not available outside a python model's worker")
        return _bls_async_execute(self, decoupled)

    @property
    def sent_response(self) -> InferenceResponse | None:
        return None if self._sender is None else self._sender.sent_response
