"""OutputWriter.write_results' one-pass path for the common batch (every output a C-contiguous
ndarray of its datatype's dtype, bound for the arena) gives exactly what the general path gives:
the same Results (refs, parameters, errors), the same lease and the same bytes in the slot; and
batches it does not cover go the general way."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.messages import Error, Lease, OutputTarget, RequestedOutput, Result
from shoal.shm.arena import Arena
from shoal.shm.client_regions import ClientRegions
from shoal.workers.backends.base import BackendResponse, OutputTensor
from shoal.workers.device_regions import DeviceRegions, LazyCudaIpc
from shoal.workers.output_lending import OutputLender
from shoal.workers.outputs import OutputWriter

from .test_output_lending import arena_view


@pytest.fixture
def writers(shm_prefix: str) -> Iterator[tuple[Arena, OutputWriter, Arena, OutputWriter]]:
    """Two writers on two arenas: the first as built, the second forced the general way."""
    plain_arena = Arena(shm_prefix + "p-", 1 << 16, 1 << 20)
    general_arena = Arena(shm_prefix + "g-", 1 << 16, 1 << 20)
    plain = OutputWriter("w", plain_arena, ClientRegions(), DeviceRegions(LazyCudaIpc()),
                         OutputLender(plain_arena))
    general = OutputWriter("w", general_arena, ClientRegions(), DeviceRegions(LazyCudaIpc()),
                           OutputLender(general_arena))
    general._write_plain = lambda *args: None  # type: ignore[method-assign]
    yield plain_arena, plain, general_arena, general
    plain_arena.close()
    general_arena.close()


def _batch() -> tuple[list[int], list[list[RequestedOutput]], list[BackendResponse | Error]]:
    batch = np.arange(30, dtype=np.float32).reshape(5, 6)
    responses: list[BackendResponse | Error] = [
        BackendResponse([OutputTensor("Y", "FP32", batch[0:1]),
                         OutputTensor("I", "INT64", np.array([[3, -4]], np.int64))],
                        {"p": 1, "q": "x"}),
        Error(ErrorCode.INVALID_ARG, "failed before the writer"),
        BackendResponse([OutputTensor("Y", "FP32", batch[1:3]),
                         OutputTensor("B", "BOOL", np.array([True, False, True]))]),
        # asks for an output it did not produce: answered without it (Triton), no error
        BackendResponse([OutputTensor("Y", "FP32", batch[3:4])]),
        BackendResponse([OutputTensor("H", "BF16", np.array([1, 2, 3], np.uint16)),
                         OutputTensor("Y", "FP32", batch[4:5])]),
        BackendResponse([]),
    ]
    requested = [[], [], [RequestedOutput("B"), RequestedOutput("Y")], [RequestedOutput("Z")],
                 [RequestedOutput("Y")], []]
    return [11, 12, 13, 14, 15, 16], requested, responses


def _contents(arena: Arena, results: list[Result]) -> list[list[bytes]]:
    return [[ref.inline if ref.inline is not None else
             bytes(arena_view(arena, ref.region, ref.offset, ref.nbytes)) for ref in r.outputs]
            for r in results]


def _without_names(results: list[Result], lease: Lease | None
                   ) -> tuple[list[Result], int | None]:
    """Results and lease id with the region names (which differ between the two arenas) left
    out."""
    import msgspec

    return ([msgspec.structs.replace(r, outputs=[msgspec.structs.replace(ref, region="")
                                                for ref in r.outputs]) for r in results],
            None if lease is None else lease.lease_id)


def test_the_plain_path_answers_exactly_as_the_general_path(
        writers: tuple[Arena, OutputWriter, Arena, OutputWriter]) -> None:
    plain_arena, plain, general_arena, general = writers
    request_ids, requested, responses = _batch()
    got = plain.write_results(request_ids, requested, responses)
    expected = general.write_results(request_ids, requested, responses)
    assert _without_names(*got) == _without_names(*expected)
    assert _contents(plain_arena, got[0]) == _contents(general_arena, expected[0])
    assert plain_arena.used_bytes == general_arena.used_bytes > 0
    assert [r.error is not None for r in got[0]] == [False, True, False, False, False, False]
    assert got[0][3].outputs == []  # asked for Z only, which the model did not produce
    assert got[0][2].outputs[0].name == "B" and got[0][2].outputs[1].name == "Y"
    assert got[0][0].parameters == {"p": 1, "q": "x"}
    # three responses hold the lease (those with arena outputs): freed at the third release
    assert got[1] is not None
    for _ in range(2):
        plain.release(got[1].lease_id)
    assert plain_arena.used_bytes > 0
    plain.release(got[1].lease_id)
    assert plain_arena.used_bytes == 0


@pytest.mark.parametrize("odd", ["strided", "other dtype", "empty", "target"])
def test_batches_the_plain_path_does_not_cover_are_still_answered(
        writers: tuple[Arena, OutputWriter, Arena, OutputWriter], odd: str) -> None:
    plain_arena, plain, general_arena, general = writers
    request_ids, requested, responses = _batch()
    request_ids, requested, responses = request_ids[:1], requested[:1], responses[:1]
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    if odd == "strided":
        extra = OutputTensor("S", "FP32", array[:, ::2])
    elif odd == "other dtype":
        extra = OutputTensor("S", "FP32", np.arange(4, dtype=np.float64))
    elif odd == "empty":
        extra = OutputTensor("S", "FP32", np.zeros((0, 4), np.float32))
    else:  # a client region that does not exist: the general path's error for that response
        extra = OutputTensor("S", "FP32", array)
        requested = [[RequestedOutput("S", target=OutputTarget("/no-such-region", 0, 64))]]
    first = responses[0]
    assert isinstance(first, BackendResponse)
    responses = [BackendResponse([*first.outputs, extra], first.parameters)]
    got = plain.write_results(request_ids, requested, responses)
    expected = general.write_results(request_ids, requested, responses)
    assert _without_names(*got) == _without_names(*expected)
    assert _contents(plain_arena, got[0]) == _contents(general_arena, expected[0])
    if odd == "other dtype":  # cast to the datatype, as write_array does
        assert got[0][0].outputs[-1].nbytes == 16
    if odd == "empty":  # no bytes: carried inline, in no slot
        assert got[0][0].outputs[-1].inline == b""
        assert got[0][0].outputs[-1].shape == [0, 4]


def test_an_unknown_datatype_is_refused_as_by_the_general_path(
        writers: tuple[Arena, OutputWriter, Arena, OutputWriter]) -> None:
    # a float64 array: numpy's ``dtype == None`` is True for float64, so the plain path must
    # not compare the array's dtype with the lookup of an unknown name
    _, plain, _, general = writers
    responses: list[BackendResponse | Error] = [
        BackendResponse([OutputTensor("S", "FP128", np.arange(4, dtype=np.float64))])]
    outcomes = []
    for writer in (plain, general):
        with pytest.raises(ShoalError) as raised:
            writer.write_results([1], [[]], responses)
        outcomes.append((raised.value.code, raised.value.message))
    assert outcomes[0] == outcomes[1]
    assert "FP128" in outcomes[0][1]


def test_undelivered_outputs_are_the_response_error_a_model_error_is_not(
        writers: tuple[Arena, OutputWriter, Arena, OutputWriter]) -> None:
    """A response whose outputs cannot be delivered (a client region too small, one that
    cannot be mapped) executed: its error is the response's (``in_response``, counted as a
    success, as Triton does); an error the model or the worker gave passes as it is."""
    _, plain, _, _ = writers
    array = np.arange(12, dtype=np.float32)
    model_error = Error(ErrorCode.INTERNAL, "the model failed")
    responses: list[BackendResponse | Error] = [
        BackendResponse([OutputTensor("Y", "FP32", array)]),
        BackendResponse([OutputTensor("Y", "FP32", array)]),
        model_error,
        BackendResponse([OutputTensor("Y", "FP32", array)]),
    ]
    requested = [[RequestedOutput("Y", target=OutputTarget("/no-such-region", 0, 8))],
                 [RequestedOutput("Y", target=OutputTarget("/no-such-region", 0, 64,
                                                           object_id=1))],
                 [], []]
    results, lease = plain.write_results([1, 2, 3, 4], requested, responses)
    assert [r.error is not None and r.error.in_response for r in results] == [
        True, True, False, False]
    assert results[0].error is not None and "should be at least 48 bytes" in (
        results[0].error.message)
    assert results[1].error is not None and "cannot be mapped" in results[1].error.message
    assert results[2].error == model_error and results[3].error is None
    assert lease is not None
    plain.release(lease.lease_id)


def test_a_response_that_alone_never_fits_fails_alone(
        writers: tuple[Arena, OutputWriter, Arena, OutputWriter]) -> None:
    """A batch over the arena's limit (1 MiB here) because of one response: that response's
    request gets INVALID_ARG naming the limit, the others are written and answered."""
    for arena, writer in (writers[:2], writers[2:]):
        small = BackendResponse([OutputTensor("Y", "FP32", np.ones((1, 64), np.float32))])
        huge = BackendResponse([OutputTensor("Y", "FP32", np.ones((1, 300_000), np.float32))])
        results, lease = writer.write_results([1, 2, 3], [[], [], []], [small, huge, small])
        assert [r.error is None for r in results] == [True, False, True]
        error = results[1].error
        assert error is not None and error.code is ErrorCode.INVALID_ARG
        assert "--shm-arena-byte-size" in error.message
        assert lease is not None
        assert np.frombuffer(_contents(arena, results)[0][0], np.float32).tolist() == [1.0] * 64


def test_responses_that_each_fit_but_not_together_are_a_retryable_batch_error(
        writers: tuple[Arena, OutputWriter, Arena, OutputWriter]) -> None:
    for _, writer in (writers[:2], writers[2:]):
        half = BackendResponse([OutputTensor("Y", "FP32", np.ones((1, 150_000), np.float32))])
        with pytest.raises(ShoalError) as info:
            writer.write_results([1, 2], [[], []], [half, half])
        assert info.value.code is ErrorCode.UNAVAILABLE
        assert "a batch of 2 requests" in info.value.message
