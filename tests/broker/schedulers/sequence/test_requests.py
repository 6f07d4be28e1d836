"""Every way a request can be refused on submit (Triton's sequence checks)."""

from __future__ import annotations

import pytest

from shoal.broker.schedulers.sequence import (
    ControlInputs,
    CorrelationId,
    CorridControl,
    DirectSequenceBatcher,
)
from shoal.errors import ErrorCode

from .helpers import END, START, config, request


def batcher(corrid_type: str | None = "UINT64") -> DirectSequenceBatcher:
    corrid = None if corrid_type is None else CorridControl("CORRID", corrid_type)
    return DirectSequenceBatcher(config(controls=ControlInputs(corrid=corrid)), 1)


def refusal(scheduler: DirectSequenceBatcher, *args: object, **kwargs: object) -> str:
    before = scheduler.pending_count()
    rejection = scheduler.submit(request(*args, **kwargs), now=0.0)  # type: ignore[arg-type]
    assert rejection is not None
    assert rejection.code == ErrorCode.INVALID_ARG
    assert scheduler.pending_count() == before  # a refused request never entered
    return rejection.message


@pytest.mark.parametrize("missing", [0, ""])
def test_a_request_without_correlation_id_is_rejected(missing: CorrelationId) -> None:
    assert refusal(batcher(), 1, missing, START) == (
        "inference request to model 'm' must specify a non-zero or non-empty correlation ID")


def test_a_request_with_more_than_one_row_is_rejected() -> None:
    assert refusal(batcher(), 1, 5, START, rows=2) == (
        "inference request to model 'm' must specify batch-size 1 due to requirements of "
        "sequence batcher")


def test_a_request_with_zero_rows_is_accepted_like_triton() -> None:
    assert batcher().submit(request(1, 5, START, rows=0), now=0.0) is None


@pytest.mark.parametrize("correlation_id", [9, "nine"])
def test_a_continuation_of_an_unknown_sequence_is_rejected(correlation_id: CorrelationId) -> None:
    scheduler = batcher(corrid_type=None)
    for flags in (0, END):
        assert refusal(scheduler, 1, correlation_id, flags) == (
            f"inference request for sequence {correlation_id} to model 'm' must specify the "
            "START flag on the first request of the sequence")


def test_a_continuation_after_end_is_rejected() -> None:
    scheduler = batcher()
    assert scheduler.submit(request(1, 5, START | END), now=0.0) is None
    assert "must specify the START flag" in refusal(scheduler, 2, 5)


@pytest.mark.parametrize("corrid_type", ["UINT64", "INT64", "UINT32", "INT32"])
def test_a_string_id_for_an_integer_corrid_is_accepted_like_triton(corrid_type: str) -> None:
    scheduler = batcher(corrid_type)
    assert scheduler.submit(request(1, "abcdX", START), now=0.0) is None
    # routed by the string, not by the control value: "abcdY" has the same leading bytes
    assert "must specify the START flag" in refusal(scheduler, 2, "abcdY")


def test_an_integer_id_for_a_string_corrid_is_rejected() -> None:
    assert refusal(batcher("BYTES"), 1, 3, START) == (
        "sequence batching control 'CORRID' data-type is 'UINT64', but model 'm' expects 'BYTES'")


@pytest.mark.parametrize("corrid_type", ["UINT64", "INT64", "UINT32", "INT32"])
def test_an_integer_id_fits_every_integer_corrid(corrid_type: str) -> None:
    assert batcher(corrid_type).submit(request(1, 3, START), now=0.0) is None


@pytest.mark.parametrize("correlation_id", [3, "abc"])
def test_without_a_corrid_control_both_id_kinds_are_accepted(correlation_id: CorrelationId) -> None:
    assert batcher(None).submit(request(1, correlation_id, START), now=0.0) is None


def test_a_string_id_longer_than_128_bytes_is_unsupported() -> None:
    scheduler = batcher("BYTES")
    assert scheduler.submit(request(1, "x" * 128, START), now=0.0) is None
    rejection = scheduler.submit(request(2, "é" * 65, START), now=0.0)  # 130 bytes
    assert rejection is not None and rejection.code == ErrorCode.UNSUPPORTED
    assert rejection.message == "string correlation ID cannot be longer than 128 characters"


@pytest.mark.parametrize("correlation_id", [-1, 2**64])
def test_an_integer_id_outside_uint64_is_rejected(correlation_id: int) -> None:
    assert "unsigned 64-bit" in refusal(batcher(None), 1, correlation_id, START)


def test_the_same_key_twice_is_a_broker_bug() -> None:
    scheduler = batcher()
    assert scheduler.submit(request(1, 5, START), now=0.0) is None
    with pytest.raises(ValueError, match="already queued"):
        scheduler.submit(request(1, 6, START), now=0.0)
    assert scheduler.next_batch(0, 0.0) is not None  # now running, not yet reported done
    with pytest.raises(ValueError, match="or running"):
        scheduler.submit(request(1, 5), now=0.0)


def test_integer_and_string_ids_with_the_same_text_are_different_sequences() -> None:
    scheduler = batcher(None)
    assert scheduler.submit(request(1, 5, START), now=0.0) is None
    assert "must specify the START flag" in refusal(scheduler, 2, "5")
