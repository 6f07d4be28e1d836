"""ResponseCache: probe / answer / store as FrontendDataPlane calls them, loans, figures."""

from __future__ import annotations

import asyncio

import pytest

from shoal.errors import ErrorCode, ShoalError
from shoal.frontend.response_cache import ResponseCache
from shoal.frontend.response_cache.entries import CACHE_LEASE
from shoal.messages import (
    CacheFigures,
    Error,
    InferRequest,
    InferResponse,
    Lease,
    ModelVersionInfo,
    ModelVersionState,
    OutputTarget,
    RequestedOutput,
    TensorRef,
)

_SEGMENT = {"/w-0": bytearray(b"\x01\x02\x03\x04\x05\x06\x07\x08")}


def _info(cache: bool = True, decoupled: bool = False) -> ModelVersionInfo:
    return ModelVersionInfo("m", 1, ModelVersionState.READY, "", "python", 0, [], [],
                            decoupled, b"{}", response_cache=cache)


def _request(data: bytes = b"abcd", outputs: list[RequestedOutput] | None = None,
             request_id: int = 1) -> InferRequest:
    return InferRequest(request_id, "m", 1, [TensorRef("IN", "UINT8", [4], "/fe", 0, 4)],
                        outputs=outputs or [])


def _response(request_id: int = 1) -> InferResponse:
    return InferResponse(request_id, model_version=1,
                         outputs=[TensorRef("OUT", "UINT8", [8], "/w-0", 0, 8)],
                         parameters={"p": 1}, lease=Lease("w", 5))


def _read(ref: TensorRef) -> memoryview:
    return memoryview(_SEGMENT[ref.region])[ref.offset:ref.offset + ref.nbytes]


def _no_write(request_id: int, target: OutputTarget, data: memoryview) -> None:
    raise AssertionError("no client region in this request")


def _cache(capacity: int = 10_000) -> tuple[ResponseCache, list[CacheFigures]]:
    sent: list[CacheFigures] = []
    return ResponseCache(capacity, sent.append, report_delay_s=60.0), sent


def test_a_stored_answer_answers_the_same_request_from_its_own_copy() -> None:
    async def run() -> None:
        cache, sent = _cache()
        request = _request()
        probe = cache.probe(request, _info(), lambda ref: b"abcd")
        assert probe is not None and probe.entry is None
        cache.store(request, _info(), probe, _response(), _read)
        _SEGMENT["/w-0"][:] = b"\xff" * 8  # the worker reuses its slot: the copy stays
        again = _request(request_id=2)
        hit = cache.probe(again, _info(), lambda ref: b"abcd")
        assert hit is not None and hit.entry is not None
        answer = cache.answer(again, _info(), hit, _no_write)
        assert answer.request_id == 2 and answer.parameters == {"p": 1}
        assert answer.lease is not None and answer.lease.instance == CACHE_LEASE
        (ref,) = answer.outputs
        assert cache.lends(ref.region) and (ref.name, ref.datatype, ref.shape) == (
            "OUT", "UINT8", [8])
        assert bytes(cache.view(ref)) == b"\x01\x02\x03\x04\x05\x06\x07\x08"
        cache.give_back(answer.lease)
        assert len(cache.loans) == 0
        cache.report_now()
        (figures,) = sent
        (model,) = figures.figures
        assert (model.model, model.version, model.hits, model.misses) == ("m", 1, 1, 1)
        assert model.hit_ns > 0 and model.miss_ns > 0
        cache.close()

    _SEGMENT["/w-0"][:] = b"\x01\x02\x03\x04\x05\x06\x07\x08"
    asyncio.run(run())


def test_different_input_bytes_miss() -> None:
    async def run() -> None:
        cache, _ = _cache()
        probe = cache.probe(_request(), _info(), lambda ref: b"abcd")
        assert probe is not None
        cache.store(_request(), _info(), probe, _response(), _read)
        other = cache.probe(_request(), _info(), lambda ref: b"abce")
        assert other is not None and other.entry is None
        cache.close()

    asyncio.run(run())


def test_uncacheable_requests_are_not_probed() -> None:
    async def run() -> None:
        cache, _ = _cache()
        assert cache.probe(_request(), _info(cache=False), lambda ref: b"abcd") is None
        assert cache.probe(_request(), _info(decoupled=True), lambda ref: b"abcd") is None
        assert cache.probe(_request(), _info(), lambda ref: None) is None  # a CUDA input
        from shoal.messages import CudaHandle
        cuda = OutputTarget("", 0, 8, cuda=CudaHandle(b"h" * 64, 0, 8))
        cuda_out = _request(outputs=[RequestedOutput("OUT", target=cuda)])
        assert cache.probe(cuda_out, _info(), lambda ref: b"abcd") is None
        cache.close()

    asyncio.run(run())


def test_error_answers_are_not_stored_but_count_as_misses() -> None:
    async def run() -> None:
        cache, sent = _cache()
        probe = cache.probe(_request(), _info(), lambda ref: b"abcd")
        assert probe is not None
        failed = InferResponse(1, error=Error(ErrorCode.INTERNAL, "boom"))
        cache.store(_request(), _info(), probe, failed, _read)
        assert len(cache.entries) == 0
        cache.report_now()
        assert sent[0].figures[0].misses == 1
        cache.close()

    asyncio.run(run())


def test_a_hit_writes_outputs_into_the_client_region_the_request_names() -> None:
    async def run() -> None:
        cache, _ = _cache()
        probe = cache.probe(_request(), _info(), lambda ref: b"abcd")
        assert probe is not None
        cache.store(_request(), _info(), probe, _response(), _read)
        written: list[tuple[int, OutputTarget, bytes]] = []
        target = OutputTarget("/client", 16, 8)
        shm_request = _request(outputs=[RequestedOutput("OUT", target=target)], request_id=3)
        # the key holds output names, not where they go: prime that key too
        primed = cache.probe(shm_request, _info(), lambda ref: b"abcd")
        assert primed is not None and primed.entry is None
        cache.store(shm_request, _info(), primed, _response(3), _read)
        hit = cache.probe(shm_request, _info(), lambda ref: b"abcd")
        assert hit is not None and hit.entry is not None
        answer = cache.answer(shm_request, _info(), hit,
                              lambda rid, t, data: written.append((rid, t, bytes(data))))
        assert written == [(3, target, b"\x01\x02\x03\x04\x05\x06\x07\x08")]
        (ref,) = answer.outputs
        assert (ref.region, ref.offset, ref.nbytes) == ("/client", 16, 8)
        small = _request(outputs=[RequestedOutput("OUT", target=OutputTarget("/client", 0, 4))],
                         request_id=4)
        small_hit = cache.probe(small, _info(), lambda ref: b"abcd")
        assert small_hit is not None and small_hit.entry is not None
        with pytest.raises(ShoalError, match="should be at least 8 bytes"):
            cache.answer(small, _info(), small_hit, lambda rid, t, data: None)
        cache.close()

    _SEGMENT["/w-0"][:] = b"\x01\x02\x03\x04\x05\x06\x07\x08"
    asyncio.run(run())


def test_an_entry_larger_than_the_cache_is_not_stored() -> None:
    async def run() -> None:
        cache, _ = _cache(capacity=100)
        probe = cache.probe(_request(), _info(), lambda ref: b"abcd")
        assert probe is not None
        cache.store(_request(), _info(), probe, _response(), _read)  # 8 bytes + overhead
        assert len(cache.entries) == 0
        cache.close()

    asyncio.run(run())


def test_figures_are_reported_once_after_the_delay() -> None:
    async def run() -> None:
        sent: list[CacheFigures] = []
        cache = ResponseCache(10_000, sent.append, report_delay_s=0.01)
        for _ in range(3):
            probe = cache.probe(_request(), _info(), lambda ref: b"zzzz")
            assert probe is not None
            cache.store(_request(), _info(), probe, InferResponse(1, error=Error(
                ErrorCode.INTERNAL, "x")), _read)
        await asyncio.sleep(0.05)
        assert [f.figures[0].misses for f in sent] == [3]
        cache.close()

    asyncio.run(run())
