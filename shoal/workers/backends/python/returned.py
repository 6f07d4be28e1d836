"""What a python model's ``execute`` gave back, judged as Triton's stub judges it
(docs/architecture.md §7, the python backend).

- ``check_returned``: a non-decoupled execute's return value -> one ``InferenceResponse`` per
  request (from the list or from the request's response sender), or None for a request whose
  sender is open and unanswered; raises ``TritonModelException`` with Triton's messages when
  the model broke the contract.
- ``execute_failed``: execute raised: logs it once (with the traceback) and gives the Error
  every request of the call gets.
- ``returned_not_none``: a decoupled execute returned something: logs it and gives Triton's
  Error for it.
"""

from __future__ import annotations

import logging
from typing import Any

from shoal.errors import ErrorCode
from shoal.messages import Error
from shoal.workers.backends.python import pb_utils
from shoal.workers.backends.python.pb_request import InferenceRequest, InferenceResponse

logger = logging.getLogger(__name__)


def check_returned(requests: list[InferenceRequest], returned: Any, instance: str
                   ) -> list[InferenceResponse | None]:
    """One InferenceResponse per request, from the returned list or the response senders, or
    None for a request whose sender is open and unanswered (its response comes later);
    raises TritonModelException with Triton's messages when the model broke the contract.
    A request whose sender already sent a response keeps it when execute also returned one
    (Triton's stub sends the first and fails on the second; the error is logged)."""
    if returned is None:
        returned = [None] * len(requests)
    if not isinstance(returned, list):
        raise pb_utils.TritonModelException(
            f"Expected a list in the execute return, found type '{type(returned)}'.")
    if len(returned) != len(requests):
        raise pb_utils.TritonModelException(
            "Number of InferenceResponse objects do not match the number of InferenceRequest "
            f"objects. InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) "
            f"size is:{len(returned)}")
    responses: list[InferenceResponse | None] = []
    for request, item in zip(requests, returned, strict=True):
        sent = request.sent_response
        if request.release_rescheduled():  # answered by a later execution
            if item is not None:
                raise pb_utils.TritonModelException(
                    "Expected a None object in the execute function return list for "
                    f"reschduled request, got {type(item)}")  # sic: Triton's text, matched
            responses.append(None)
            continue
        if item is None:
            if sent is None and (request._sender is None or request._sender.closed):
                raise pb_utils.TritonModelException(
                    "execute returned None for a request without sending its response")
            responses.append(sent)
            continue
        if not isinstance(item, InferenceResponse):
            raise pb_utils.TritonModelException(
                "Expected an 'InferenceResponse' object in the execute function return list, "
                f"found type '{type(item)}'.")
        if sent is not None:
            logger.error("model instance '%s': a response returned from execute for a request "
                         "that already sent one through its response sender is dropped "
                         "(Non-decoupled model cannot send more than one response.)", instance)
            item = sent
        responses.append(item)
    return responses


def execute_failed(instance: str, exc: BaseException, count: int) -> Error:
    """execute() raised: logged once (with its traceback), and the error every request of
    the call gets."""
    logger.error("model instance '%s' failed to execute %d request(s)", instance, count,
                 exc_info=exc)
    return Error(ErrorCode.INTERNAL,
                 f"Failed to process the request(s) for model '{instance}', "
                 f"message: {type(exc).__name__}: {exc}")


def returned_not_none(instance: str, returned: Any) -> Error:
    """A decoupled execute returned ``returned`` (it must return None)."""
    logger.error("decoupled model instance '%s' returned %s from execute (must return "
                 "None)", instance, type(returned).__name__)
    return Error(ErrorCode.INTERNAL,
                 f"Python model '{instance}' is using the decoupled mode "
                 "and the execute function must return None.")
