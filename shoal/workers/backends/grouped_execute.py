"""The execute loop of the backends that run a whole batch through their runtime in one call
(onnxruntime, openvino, tensorflow).

Contract: every request's inputs are checked first (present, and with the request's batch size
as dim 0 when the model batches); a request that fails the check gets its own INVALID_ARG error
and does not run. The others run together in one ``run`` call when the model batches
(``max_batch_size > 0``), else one call each. A ShoalError from ``run`` becomes that error for
every request of the call; any other exception is logged with its traceback and becomes
INTERNAL "<runtime> execute failure: <describe(exc)>". The result list is parallel to
``requests``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from shoal.errors import ErrorCode, ShoalError
from shoal.messages import Error
from shoal.workers.backends.base import BackendRequest, BackendResponse

RunBatch = Callable[[list[BackendRequest]], list[BackendResponse | Error]]


def last_line(exc: BaseException) -> str:
    """The last non-empty line of an exception's text (runtimes put the reason there, after
    their own stack dumps), or the exception's type name."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def check_inputs(request: BackendRequest, names: Sequence[str],
                 batched: bool) -> Error | None:
    """None when ``request`` has every input in ``names`` (with dim 0 = its batch size when
    ``batched``), else the error that names the first one that does not."""
    for name in names:
        array = request.inputs.get(name)
        if array is None:
            return Error(ErrorCode.INVALID_ARG, f"input '{name}' is missing")
        if batched and (array.ndim == 0 or array.shape[0] != request.batch_size):
            return Error(ErrorCode.INVALID_ARG,
                         f"input '{name}' has shape {list(array.shape)}, expected batch "
                         f"dimension {request.batch_size}")
    return None


def execute_grouped(requests: list[BackendRequest], *, batched: bool,
                    input_names: Sequence[str], run: RunBatch, runtime: str, instance: str,
                    log: logging.Logger,
                    describe: Callable[[BaseException], str] = last_line,
                    ) -> list[BackendResponse | Error | None]:
    results: list[BackendResponse | Error | None] = [
        check_inputs(request, input_names, batched) for request in requests]
    runnable = [index for index, problem in enumerate(results) if problem is None]
    groups = [runnable] if batched else [[index] for index in runnable]
    for group in groups:
        if not group:
            continue
        batch = [requests[index] for index in group]
        outcome = _run_guarded(batch, run, runtime, instance, log, describe)
        for index, result in zip(group, outcome, strict=True):
            results[index] = result
    return results


def _run_guarded(batch: list[BackendRequest], run: RunBatch, runtime: str, instance: str,
                 log: logging.Logger,
                 describe: Callable[[BaseException], str]) -> list[BackendResponse | Error]:
    try:
        return run(batch)
    except ShoalError as exc:
        return [Error(exc.code, exc.message)] * len(batch)
    except Exception as exc:
        log.exception("%s instance '%s' failed on %d request(s)", runtime, instance, len(batch))
        return [Error(ErrorCode.INTERNAL, f"{runtime} execute failure: {describe(exc)}")] \
            * len(batch)
