"""What the sequence batcher knows about one request, and the checks Triton makes before a
request enters a sequence (messages as Triton's ``SequenceBatchScheduler::Enqueue`` and the
``Sequencer``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from shoal import correlation_ids
from shoal.broker.schedulers.base import QueuedRequest, Rejection
from shoal.config.sequence_batching import SequenceBatcherConfig
from shoal.errors import ErrorCode

CorrelationId = int | str
"""uint64 or string; 0 and "" mean "no sequence". 5 and "5" are different sequences."""

SEQUENCE_START: Final = 1
SEQUENCE_END: Final = 2
_MAX_UINT64: Final = (1 << 64) - 1

BACKLOG_TIMEOUT_MESSAGE: Final = "timeout of the corresponding sequence has been expired"


@dataclass(slots=True)
class SequenceRequest(QueuedRequest):
    """A QueuedRequest with its sequence fields (``InferRequest.correlation_id`` / ``flags``).
    ``timeout_us`` applies only while the request's sequence waits in the backlog (Triton);
    ``priority`` is ignored. ``shape_signature``: requests run in one execution only when equal
    (direct: a slot whose next request differs runs as a not-ready row this time)."""

    correlation_id: CorrelationId = 0
    flags: int = 0

    @property
    def starts(self) -> bool:
        return bool(self.flags & SEQUENCE_START)

    @property
    def ends(self) -> bool:
        return bool(self.flags & SEQUENCE_END)


def has_correlation_id(correlation_id: CorrelationId) -> bool:
    return correlation_id != 0 and correlation_id != ""


def id_text(correlation_id: CorrelationId) -> str:
    return correlation_id if isinstance(correlation_id, str) else str(correlation_id)


def check_request(config: SequenceBatcherConfig, request: SequenceRequest) -> Rejection | None:
    """The checks that do not depend on the batcher's state, in Triton's order: the id itself
    (a string over 128 bytes is refused before any model sees it; a client's is refused by the
    frontend already, this catches BLS and ensemble requests), an integer id for a string
    CORRID, then batch size, then a missing id.

    A string id for an integer CORRID is accepted, as Triton 2.51 accepts it: the sequence is
    routed by the string, and the control carries the bytes ``controls.corrid_integer`` says.
    An integer id for a string CORRID is refused (INVALID_ARG, shoal's message): Triton 2.51
    lets it through but fills the string control with the integer's raw bytes, which the
    backend then refuses as a malformed BYTES tensor (also INVALID_ARG)."""
    model = config.model_name
    correlation_id = request.correlation_id
    if isinstance(correlation_id, int) and not 0 <= correlation_id <= _MAX_UINT64:
        return _invalid(request, f"sequence_id for model '{model}' must be an unsigned 64-bit "
                                 "integer or a string")
    too_long = (correlation_ids.too_long_message(correlation_id)
                if isinstance(correlation_id, str) else None)
    if too_long is not None:
        return Rejection(request, ErrorCode.UNSUPPORTED, too_long)
    corrid = config.controls.corrid
    if (corrid is not None and corrid.data_type == "BYTES" and isinstance(correlation_id, int)
            and correlation_id != 0):
        return _invalid(request, f"sequence batching control '{corrid.name}' data-type is "
                                 f"'UINT64', but model '{model}' expects 'BYTES'")
    if request.batch_size > 1:
        return _invalid(request, f"inference request to model '{model}' must specify batch-size "
                                 "1 due to requirements of sequence batcher")
    if not has_correlation_id(correlation_id):
        return _invalid(request, f"inference request to model '{model}' must specify a non-zero "
                                 "or non-empty correlation ID")
    return None


def missing_start(config: SequenceBatcherConfig, request: SequenceRequest) -> Rejection:
    return _invalid(request, f"inference request for sequence {id_text(request.correlation_id)} "
                             f"to model '{config.model_name}' must specify the START flag on the "
                             "first request of the sequence")


def backlog_timed_out(request: SequenceRequest) -> Rejection:
    return Rejection(request, ErrorCode.UNAVAILABLE, BACKLOG_TIMEOUT_MESSAGE)


def conflict_message(config: SequenceBatcherConfig, correlation_id: CorrelationId) -> str:
    return (f"sequence {id_text(correlation_id)} for model '{config.model_name}' has a conflict. "
            "The previous sequence did not end before this sequence start. Previous sequence "
            "will be terminated early.")


def _invalid(request: SequenceRequest, message: str) -> Rejection:
    return Rejection(request, ErrorCode.INVALID_ARG, message)
