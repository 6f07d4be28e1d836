"""BlsClient against a fake broker (a ROUTER socket in the test): the wire it speaks, answers
out of order from many threads and the event loop, timeouts, streams, cancellation, model
control, and close. No server processes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import pathlib
import secrets
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import zmq

from shoal.errors import ErrorCode, ShoalError
from shoal.messages import (
    CancelRequest,
    ControlReply,
    Error,
    Hello,
    InferRequest,
    InferRequestBatch,
    InferResponse,
    Lease,
    LoadModel,
    Message,
    ModelVersionInfo,
    ModelVersionState,
    ReleaseLeases,
    RepositorySnapshot,
    TensorRef,
    TensorSpec,
    UnloadModel,
    WorkerSpec,
    decode,
    encode,
)
from shoal.settings import WorkerSettings, settings_from_flags
from shoal.shm.arena import Arena
from shoal.shm.regions import RegionCache
from shoal.workers.bls.client import BlsClient
from shoal.workers.bls.requests import BlsCall, BlsInput

IDENTITY = "m:1:m_0:5"


def model(name: str, decoupled: bool = False) -> ModelVersionInfo:
    return ModelVersionInfo(name, 1, ModelVersionState.READY, "", "python", 0,
                            [TensorSpec("X", "FP32", [-1])], [TensorSpec("Y", "FP32", [-1])],
                            decoupled, b"{}")


class FakeBroker:
    """The broker's frontend ROUTER, driven by the test; answers come from a "callee" arena."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.socket = zmq.Context.instance().socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(f"ipc://{settings.instance.runtime_dir}/frontend.sock")
        self.callee = Arena(settings.instance.segment_prefix + "w9-", 64 * 1024, 256 * 1024)
        self.inputs = RegionCache(settings.instance.segment_prefix)
        self.peer = b""
        self.last_region = ""

    def receive(self, timeout_ms: int = 5000) -> Message:
        if not self.socket.poll(timeout_ms):
            raise TimeoutError("nothing from the client")
        identity, *frames = self.socket.recv_multipart()
        self.peer = identity
        return decode(frames)

    def expect(self, kind: type[Any], timeout_ms: int = 5000) -> Any:
        message = self.receive(timeout_ms)
        if isinstance(message, InferRequestBatch) and kind is InferRequest:
            assert len(message.requests) == 1, "expected one request"
            return message.requests[0]
        assert isinstance(message, kind), message
        return message

    def requests(self, count: int) -> list[InferRequest]:
        found: list[InferRequest] = []
        while len(found) < count:
            message = self.receive()
            if isinstance(message, InferRequestBatch):
                found.extend(message.requests)
            else:
                assert isinstance(message, InferRequest), message
                found.append(message)
        return found

    def send(self, message: Message) -> None:
        self.socket.send_multipart([self.peer, *encode(message)])

    def handshake(self, *models: ModelVersionInfo) -> None:
        hello = self.expect(Hello)
        assert hello.frontend_id == f"bls-{IDENTITY}" and self.peer == hello.frontend_id.encode()
        self.send(RepositorySnapshot(models=list(models), models_ready=True))

    def input_array(self, request: InferRequest, index: int = 0) -> np.ndarray:
        ref = request.inputs[index]
        view = self.inputs.view(ref.region, ref.offset, ref.nbytes)
        return np.frombuffer(view, np.float32).copy()

    def answer(self, request: InferRequest, values: np.ndarray, lease_id: int = 1,
               final: bool = True) -> Lease:
        data = values.astype(np.float32).tobytes()
        slot = self.callee.allocate(len(data))
        slot.view[:] = data
        self.last_region = slot.region
        lease = Lease("callee", lease_id)
        ref = TensorRef("Y", "FP32", [values.size], slot.region, slot.offset, slot.nbytes)
        self.send(InferResponse(request.request_id, 1, [ref], lease=lease, final=final))
        return lease

    def close(self) -> None:
        self.inputs.close()
        self.callee.close()
        self.socket.close(linger=0)


@pytest.fixture
def settings(tmp_path: pathlib.Path) -> WorkerSettings:
    return settings_from_flags(model_repositories=[], runtime_dir=str(tmp_path),
                               instance_id=secrets.token_hex(6), shm_segment_bytes=64 * 1024,
                               shm_arena_max_bytes=256 * 1024).for_workers()


@pytest.fixture
def broker(settings: WorkerSettings) -> Iterator[FakeBroker]:
    fake = FakeBroker(settings)
    yield fake
    fake.close()


@pytest.fixture
def client(settings: WorkerSettings, broker: FakeBroker) -> Iterator[BlsClient]:
    spec = WorkerSpec(identity=IDENTITY, model_name="m", model_version=1, model_dir="",
                      version_dir="", backend="python", config_json="{}", instance_name="m_0",
                      kind="CPU", device_id=0, broker_endpoint="",
                      arena_prefix=settings.instance.segment_prefix + "w5-",
                      settings=settings)
    created = BlsClient(spec, spec.settings, zmq.Context.instance())
    yield created
    created.close()


def call(values: list[float], name: str = "callee", **kw: Any) -> BlsCall:
    array = np.array(values, np.float32)
    return BlsCall(name, [BlsInput("X", "FP32", [array.size], array)], **kw)


@pytest.fixture
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(8) as executor:
        yield executor


def test_nothing_is_created_before_the_first_call(client: BlsClient,
                                                  broker: FakeBroker) -> None:
    assert not client.started
    with pytest.raises(TimeoutError):
        broker.receive(timeout_ms=100)


def test_a_call_places_its_inputs_and_gets_views_whose_lease_comes_back(
        client: BlsClient, broker: FakeBroker,
        pool: concurrent.futures.ThreadPoolExecutor) -> None:
    pending = pool.submit(client.call, call([1, 2, 3], request_id="r1"))
    broker.handshake(model("callee"))
    request = broker.expect(InferRequest)
    assert (request.model, request.version, request.client_request_id) == ("callee", 1, "r1")
    assert request.inputs[0].region.startswith(client._arena_prefix)
    assert broker.input_array(request).tolist() == [1, 2, 3]
    lease = broker.answer(request, broker.input_array(request) * 10)
    answer = pending.result(5)
    array = answer.outputs[0].array
    assert array.tolist() == [10, 20, 30] and not array.flags.owndata
    assert client._arena is not None and client._arena.used_bytes == 0  # inputs freed
    del answer, array, pending
    gc.collect()
    assert broker.expect(ReleaseLeases).leases == [lease]


def test_concurrent_callers_get_their_own_answers(client: BlsClient, broker: FakeBroker,
                                                  pool: concurrent.futures.ThreadPoolExecutor
                                                  ) -> None:
    futures = [pool.submit(client.call, call([float(i)])) for i in range(8)]
    broker.handshake(model("callee"))
    requests = broker.requests(8)
    for request in reversed(requests):  # answered out of order
        broker.answer(request, broker.input_array(request) + 100, lease_id=request.request_id)
    assert [f.result(5).outputs[0].array[0] for f in futures] == [100 + i for i in range(8)]


def test_async_calls_run_together_on_the_event_loop(client: BlsClient, broker: FakeBroker,
                                                    pool: concurrent.futures.ThreadPoolExecutor
                                                    ) -> None:
    async def gather() -> list[float]:
        answers = await asyncio.gather(*(client.call_async(call([float(i)])) for i in range(4)))
        return [float(a.outputs[0].array[0]) for a in answers]

    pending = pool.submit(asyncio.run, gather())
    broker.handshake(model("callee"))
    requests = broker.requests(4)  # all four are out before any is answered
    for request in requests:
        broker.answer(request, broker.input_array(request) * 2, lease_id=request.request_id)
    assert pending.result(5) == [0, 2, 4, 6]


def test_errors_before_sending_are_answers(client: BlsClient, broker: FakeBroker,
                                           pool: concurrent.futures.ThreadPoolExecutor) -> None:
    pending = pool.submit(client.call, call([1], name="missing"))
    broker.handshake(model("callee"))
    answer = pending.result(5)
    assert answer.error is not None and answer.error.message == (
        "Model missing - Error when running inference: Failed for execute the inference "
        "request. Model 'missing' is not ready.")
    wrong = BlsCall("callee", [BlsInput("X", "INT32", [1], np.array([1], np.int32))])
    assert "data-type is 'INT32'" in client.call(wrong).error.message  # type: ignore[union-attr]
    with pytest.raises(TimeoutError):
        broker.receive(timeout_ms=100)  # nothing was sent


def test_a_timeout_answers_at_once_cancels_and_frees_the_inputs_at_the_final_answer(
        client: BlsClient, broker: FakeBroker,
        pool: concurrent.futures.ThreadPoolExecutor) -> None:
    pending = pool.submit(client.call, call([1, 2], timeout_us=100_000))
    broker.handshake(model("callee"))
    request = broker.expect(InferRequest)
    assert request.timeout_us == 100_000
    answer = pending.result(5)
    assert answer.error == Error(ErrorCode.UNAVAILABLE, "Request timeout expired")
    assert broker.expect(CancelRequest).request_id == request.request_id
    assert client._arena is not None and client._arena.used_bytes > 0  # the callee may read
    lease = broker.answer(request, np.ones(2))  # the late answer: nobody wants it
    assert broker.expect(ReleaseLeases).leases == [lease]
    assert client._arena.used_bytes == 0


def test_a_stream_delivers_every_answer_and_can_be_cancelled(
        client: BlsClient, broker: FakeBroker,
        pool: concurrent.futures.ThreadPoolExecutor) -> None:
    opened = pool.submit(client.stream, call([1], name="gen", decoupled=True))
    broker.handshake(model("gen", decoupled=True))
    request = broker.expect(InferRequest)
    stream = opened.result(5)
    broker.answer(request, np.array([1.0]), lease_id=1, final=False)
    first = stream.next()
    assert first.final is False and first.outputs[0].array.tolist() == [1.0]
    stream.cancel()
    assert broker.expect(CancelRequest).request_id == request.request_id
    broker.send(InferResponse(request.request_id, final=True, empty=True))
    last = stream.next()
    assert last.final and last.outputs == [] and last.error is None


def test_an_abandoned_stream_gives_later_answers_back(
        client: BlsClient, broker: FakeBroker,
        pool: concurrent.futures.ThreadPoolExecutor) -> None:
    opened = pool.submit(client.stream, call([1], name="gen", decoupled=True))
    broker.handshake(model("gen", decoupled=True))
    request = broker.expect(InferRequest)
    opened.result(5).abandon()
    assert broker.expect(CancelRequest).request_id == request.request_id
    lease = broker.answer(request, np.array([1.0]), final=False)
    assert broker.expect(ReleaseLeases).leases == [lease]


def test_model_control_waits_for_the_reply(client: BlsClient, broker: FakeBroker,
                                           pool: concurrent.futures.ThreadPoolExecutor) -> None:
    loading = pool.submit(client.load_model, "other", "{}", {"file:1/model.py": b"x"})
    broker.handshake()
    load = broker.expect(LoadModel)
    assert (load.model, load.config, load.files) == ("other", "{}", {"file:1/model.py": b"x"})
    broker.send(RepositorySnapshot(models=[model("other")], models_ready=True))
    broker.send(ControlReply(load.query_id))
    loading.result(5)
    assert client.model_ready("other") and not client.model_ready("callee")
    unloading = pool.submit(client.unload_model, "other", True)
    unload = broker.expect(UnloadModel)
    assert unload.unload_dependents
    broker.send(ControlReply(unload.query_id, Error(ErrorCode.UNAVAILABLE, "not allowed")))
    with pytest.raises(ShoalError, match="not allowed"):
        unloading.result(5)


def test_close_fails_waiting_calls_and_removes_the_arena(
        client: BlsClient, broker: FakeBroker, settings: WorkerSettings,
        pool: concurrent.futures.ThreadPoolExecutor) -> None:
    pending = pool.submit(client.call, call([1]))
    broker.handshake(model("callee"))
    request = broker.expect(InferRequest)
    segment = request.inputs[0].region
    client.close()
    answer = pending.result(5)
    assert answer.error is not None and answer.error.code is ErrorCode.UNAVAILABLE
    assert not pathlib.Path("/dev/shm" + segment).exists()
    after = client.call(call([1]))
    assert after.error is not None and "shutting down" in after.error.message


def test_a_segment_of_its_own_is_unmapped_when_its_lease_comes_back(
        client: BlsClient, broker: FakeBroker,
        pool: concurrent.futures.ThreadPoolExecutor) -> None:
    pending = pool.submit(client.call, call([1]))
    broker.handshake(model("callee"))
    request = broker.expect(InferRequest)
    big = np.arange(20_000, dtype=np.float32)  # 80 KB: more than a 64 KiB segment
    lease = broker.answer(request, big)
    answer = pending.result(5)
    assert answer.outputs[0].array[-1] == 19_999
    assert client._link is not None
    cache = client._link._memory._cache
    assert (cache.mapped_size(broker.last_region) or 0) > 64 * 1024
    del answer, pending
    gc.collect()
    assert broker.expect(ReleaseLeases).leases == [lease]
    deadline = time.monotonic() + 2
    while broker.last_region in cache and time.monotonic() < deadline:
        time.sleep(0.01)
    assert broker.last_region not in cache  # its pages are not pinned by this worker any more
