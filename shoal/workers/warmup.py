"""Model warmup (``model_warmup`` in config.pbtxt), with Triton's semantics.

Every instance runs the samples after its backend loaded and before it reports WorkerReady, so
a model is not READY until warmup is done. Sample ``s`` runs ``max(s.count, 1)`` times, in config
order; each run is one ``backend.execute`` call with ``s.batch_size`` requests (Triton's
GenerateWarmupData). A request's input has shape ``[1] + dims`` when the model batches
(``max_batch_size > 0``), else ``dims``; every output is requested. Data: ``zero_data`` zeros
(BYTES: empty strings), ``random_data`` random values (BYTES: as zero_data, as Triton), or
``input_data_file``: the raw little-endian bytes of one request's tensor (BYTES: 4-byte
length-prefixed elements) in ``<model_dir>/warmup/<file>``, whose size must match exactly.

A sample fails when its inputs cannot be built, execute raises, returns the wrong number of
responses, or any request ends in an error; the load then fails with ``model warmup sample
'<name>' failed: <reason>``. Responses are not checked otherwise (as in Triton).

Warmup requests have ids of their own range (``is_warmup_request``). A decoupled model answers
them through ``InstanceContext.send_response``, which the worker points at a
``WarmupResponseSink``: those responses stay in the worker and never reach the broker.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt
from tritonclient.grpc import model_config_pb2 as pb

from shoal.config.model_config_checks import WARMUP_FOLDER, warmup_file_problem
from shoal.dtypes import bytes_to_object_array, config_to_wire, element_count, element_size
from shoal.dtypes import numpy_dtype as dtype_of
from shoal.errors import ErrorCode, ShoalError, invalid_arg
from shoal.messages import Error
from shoal.workers.backends.base import (
    Backend,
    BackendRequest,
    BackendResponse,
    Rescheduled,
    ResponseSink,
)

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

logger = logging.getLogger(__name__)

# Warmup request ids count down from here; broker request ids are >= 0 and the not-ready rows of
# a sequence batch use small negative ids, so the ranges never meet.
FIRST_WARMUP_REQUEST_ID: Final = -(1 << 62)
# How long a decoupled model may take, after execute returned, to send every final response.
FINAL_RESPONSE_TIMEOUT_S: Final = 60.0

Array = npt.NDArray[Any]


def is_warmup_request(request_id: int) -> bool:
    return request_id <= FIRST_WARMUP_REQUEST_ID


@dataclass(frozen=True)
class WarmupSample:
    """One ``model_warmup`` entry, ready to run. ``inputs`` holds the arrays every request of a
    run gets (shared, not copied: a backend must not write its inputs); ``executions`` >= 1."""

    name: str
    batch_size: int
    executions: int
    inputs: dict[str, Array]
    datatypes: dict[str, str]
    outputs: list[str]

    def requests(self, request_ids: Sequence[int]) -> list[BackendRequest]:
        """The requests of one run, one per id (``batch_size`` ids)."""
        return [BackendRequest(request_id=request_id, inputs=dict(self.inputs),
                               input_datatypes=dict(self.datatypes),
                               requested_outputs=list(self.outputs), parameters={})
                for request_id in request_ids]


# ------------------------------------------------------------------ building the samples


def build_samples(config: ModelConfig, model_dir: str,
                  rng: np.random.Generator | None = None) -> list[WarmupSample]:
    """The samples of ``config.model_warmup`` (a normalized ModelConfig), files read from
    ``<model_dir>/warmup/``. Raises ShoalError naming the sample whose inputs cannot be built."""
    rng = rng if rng is not None else np.random.default_rng()
    outputs = [io.name for io in config.output]
    samples: list[WarmupSample] = []
    for sample in config.model_warmup:
        try:
            arrays = {name: sample_input(name, sample.inputs[name], config.max_batch_size,
                                         model_dir, rng)
                      for name in sorted(sample.inputs)}
        except ShoalError as exc:
            raise _sample_failed(sample.name, exc.message) from None
        datatypes = {name: _wire_type(spec.data_type) for name, spec in sample.inputs.items()}
        samples.append(WarmupSample(sample.name, max(int(sample.batch_size), 1),
                                    max(int(sample.count), 1), arrays, datatypes, outputs))
    return samples


def sample_input(name: str, spec: Any, max_batch_size: int, model_dir: str,
                 rng: np.random.Generator) -> Array:
    """One request's value of warmup input ``name`` (a ``ModelWarmup.Input``)."""
    datatype = _wire_type(spec.data_type)
    shape = ([1] if max_batch_size > 0 else []) + [int(d) for d in spec.dims]
    if any(d < 0 for d in shape):
        raise invalid_arg(f"input '{name}': dims {list(spec.dims)} have a variable-size "
                          "dimension")
    choice = spec.WhichOneof("input_data_type")
    if choice == "zero_data":
        return zero_array(datatype, shape)
    if choice == "random_data":
        return random_array(datatype, shape, rng)
    if choice == "input_data_file":
        path = warmup_file_path(model_dir, spec.input_data_file)
        return file_array(path, spec.input_data_file, datatype, shape, name)
    raise invalid_arg(f"input '{name}' must specify one of 'zero_data', 'random_data' or "
                      "'input_data_file'")


def zero_array(datatype: str, shape: Sequence[int]) -> Array:
    """Zeros of ``datatype`` (wire name); BYTES: empty byte strings."""
    if datatype == "BYTES":
        return np.full(tuple(shape), b"", dtype=np.object_)
    return np.zeros(tuple(shape), dtype=dtype_of(datatype))


def random_array(datatype: str, shape: Sequence[int], rng: np.random.Generator) -> Array:
    """Random values of ``datatype``: integers over the whole range of the type, BOOL false or
    true, floats (BF16: bit patterns) uniform in [0, 1). BYTES: as ``zero_array`` (Triton)."""
    size = tuple(shape)
    if datatype == "BYTES":
        return zero_array(datatype, size)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=size).astype(np.bool_)
    if datatype == "BF16":  # the top half of a float32 is its bfloat16
        return (rng.random(size, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    dtype = dtype_of(datatype)
    if dtype.kind == "f":
        return rng.random(size).astype(dtype)
    random_bytes = bytearray(rng.bytes(element_count(size) * dtype.itemsize))
    return np.frombuffer(random_bytes, dtype=dtype).reshape(size)


def warmup_file_path(model_dir: str, file_name: str) -> str:
    """``<model_dir>/warmup/<file_name>``, refused (INVALID_ARG) unless the name is relative and,
    with every symlink resolved, still inside the model's warmup folder."""
    problem = warmup_file_problem(file_name)
    if problem is not None:
        raise invalid_arg(problem)
    folder = os.path.realpath(os.path.join(model_dir, WARMUP_FOLDER))
    path = os.path.realpath(os.path.join(folder, file_name))
    if os.path.commonpath([folder, path]) != folder or path == folder:
        raise invalid_arg(f"input_data_file '{file_name}' leads outside the model's "
                          f"'{WARMUP_FOLDER}/' folder")
    return path


def file_array(path: str, file_name: str, datatype: str, shape: Sequence[int],
               name: str) -> Array:
    """The tensor stored at ``path`` (named ``file_name`` in errors, never the full path)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise invalid_arg(f"input '{name}': cannot read input_data_file '{file_name}': "
                          f"{exc.strerror}") from None
    if datatype == "BYTES":
        try:
            return bytes_to_object_array(data, list(shape))
        except ShoalError as exc:
            raise invalid_arg(f"input '{name}': input_data_file '{file_name}' does not hold "
                              f"{element_count(shape)} BYTES elements: {exc.message}") from None
    expected = element_count(shape) * element_size(datatype)
    if len(data) != expected:
        raise invalid_arg(f"input '{name}': input_data_file '{file_name}' holds {len(data)} "
                          f"bytes, expected {expected} ({datatype} {list(shape)})")
    return np.frombuffer(bytearray(data), dtype=dtype_of(datatype)).reshape(tuple(shape))


def _wire_type(data_type: int) -> str:
    # ValueType: int at run time, the enum's NewType in the stub (typings/)
    return config_to_wire(pb.DataType.Name(pb.DataType.ValueType(data_type)))


def _sample_failed(sample_name: str, reason: str) -> ShoalError:
    return ShoalError(ErrorCode.INVALID_ARG,
                      f"model warmup sample '{sample_name}' failed: {reason}")


# ------------------------------------------------------------------ decoupled responses


class WarmupResponseSink:
    """The ``InstanceContext.send_response`` of a worker's backend. Responses to warmup
    requests stay here: recorded while their request is open (``expect``), refused like any
    response after the final one; all other responses go to ``forward``. Thread-safe: a
    decoupled model may answer from any thread."""

    def __init__(self, forward: ResponseSink) -> None:
        self._forward = forward
        self._done = threading.Condition()
        self._errors: dict[int, list[str]] = {}  # open warmup request -> errors it got
        self._finished: dict[int, list[str]] = {}  # ended, not yet waited for -> its errors

    def __call__(self, request_id: int, response: BackendResponse | Error | None,
                 final: bool) -> None:
        if not is_warmup_request(request_id):
            self._forward(request_id, response, final)
            return
        with self._done:
            errors = self._errors.get(request_id)
            if errors is None:
                raise ShoalError(ErrorCode.INVALID_ARG,
                                 "the request has already been sent its final response")
            if isinstance(response, Error):
                errors.append(response.message)
            if final:
                self._finished[request_id] = self._errors.pop(request_id)
                self._done.notify_all()

    def expect(self, request_ids: Sequence[int]) -> None:
        """Open ``request_ids``: their responses are recorded until their final one."""
        with self._done:
            for request_id in request_ids:
                self._errors[request_id] = []

    def wait(self, request_ids: Sequence[int], timeout_s: float) -> list[str]:
        """Block until every request of ``request_ids`` had its final response, at most
        ``timeout_s``; returns the errors they got, plus one for requests still open (those are
        closed: a later response to one of them is refused)."""
        deadline = time.monotonic() + timeout_s
        with self._done:
            while any(r in self._errors for r in request_ids):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._done.wait(left)
            problems = [m for r in request_ids for m in self._finished.pop(r, [])]
            late = [r for r in request_ids if r in self._errors]
            for request_id in late:
                problems.extend(self._errors.pop(request_id))
            if late:
                problems.append(f"{len(late)} of {len(request_ids)} request(s) got no final "
                                f"response within {timeout_s:g} s")
        return problems


# ------------------------------------------------------------------ running the samples


def run_warmup(backend: Backend, samples: Sequence[WarmupSample], sink: WarmupResponseSink, *,
               decoupled: bool, final_timeout_s: float = FINAL_RESPONSE_TIMEOUT_S) -> None:
    """Run ``samples`` in order, each ``executions`` times, on the worker's main thread (the
    backend contract's only caller thread). Raises ShoalError (``model warmup sample '<name>'
    failed: <reason>``) at the first run that fails; the later samples do not run. ``sink``
    must be the ``send_response`` the backend was loaded with."""
    request_ids = itertools.count(FIRST_WARMUP_REQUEST_ID, -1)
    for sample in samples:
        started = time.perf_counter()
        for run in range(1, sample.executions + 1):
            ids = [next(request_ids) for _ in range(sample.batch_size)]
            problems = _run_once(backend, sample.requests(ids), sink, decoupled, final_timeout_s)
            if problems:
                problems = list(dict.fromkeys(problems))  # one batch error comes once per request
                if sample.executions > 1:
                    problems[0] = f"execution {run} of {sample.executions}: {problems[0]}"
                raise _sample_failed(sample.name, "; ".join(problems))
        logger.info("warmup sample '%s' done: %d execution(s) of %d request(s) in %.1f ms",
                    sample.name, sample.executions, sample.batch_size,
                    (time.perf_counter() - started) * 1e3)


def _run_once(backend: Backend, requests: list[BackendRequest], sink: WarmupResponseSink,
              decoupled: bool, final_timeout_s: float) -> list[str]:
    """One execute call; returns what went wrong (empty: the run succeeded)."""
    ids = [request.request_id for request in requests]
    if decoupled:
        sink.expect(ids)
    try:
        answers = list(backend.execute(requests))
    except Exception as exc:
        logger.exception("execute raised during warmup")
        return [exc.message if isinstance(exc, ShoalError) else f"{type(exc).__name__}: {exc}"]
    if len(answers) != len(requests):
        return [f"the backend returned {len(answers)} responses for {len(requests)} requests"]
    problems: list[str] = []
    for request_id, answer in zip(ids, answers, strict=True):
        if isinstance(answer, Rescheduled):  # warmup runs each request once
            problems.append("the model rescheduled a warmup request")
        elif decoupled and answer is not None:  # a direct answer ends the request (as the worker)
            sink(request_id, answer, True)
        elif isinstance(answer, Error):
            problems.append(answer.message)
        elif answer is None and not decoupled:
            problems.append("the model returned no response for a request")
    if decoupled:
        problems.extend(sink.wait(ids, final_timeout_s))
    return problems
