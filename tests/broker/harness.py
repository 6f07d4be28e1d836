"""The broker in process: the real ``BrokerLoop`` and ``ModelManager`` on a thread of the test,
over their real ZeroMQ sockets and real messages, with stand-ins at both ends: a frontend that is
a DEALER socket of the test (``BrokerHarness.send`` / ``answers``), and model instances that are
``FakeWorker``s speaking the worker protocol from the test process. A fake worker's "process" is
a ``sleep`` child, so killing it is a worker's death as the broker sees one (its pidfd).

What a fake worker does with a Batch is the test's ``behaviour`` (by default: one empty Result
per request); every Batch it got is kept in ``batches``. Nothing here reads tensors: inputs
are empty, answers carry no outputs. Use it for what is the broker's alone (scheduling,
rescheduling, failures, statistics, scrapes); the end-to-end tier covers the rest.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pathlib
import queue
import subprocess
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import zmq

from shoal.broker.loop import BrokerLoop
from shoal.broker.models import ModelManager
from shoal.broker.pool import WorkerHandle
from shoal.messages import (
    Batch,
    BatchResult,
    BatchTimings,
    CollectCustomMetrics,
    CustomMetricsSnapshot,
    Heartbeat,
    Hello,
    InferRequest,
    InferResponse,
    InferResponseBatch,
    Message,
    ModelVersionState,
    RepositorySnapshot,
    Result,
    StatsReply,
    WorkerReady,
    WorkerShutdown,
    WorkerSpec,
    decode,
    encode,
)
from shoal.messages.worker import HEARTBEAT_INTERVAL_S
from shoal.settings import settings_from_flags
from shoal.shm.sweep import new_instance_id

Behaviour = Callable[["FakeWorker", Batch], BatchResult | None]  # None: answer nothing


def answer_all(worker: FakeWorker, batch: Batch) -> BatchResult:
    """One empty Result per request."""
    return BatchResult(batch.batch_id, [Result(r.request_id) for r in batch.requests],
                       BatchTimings(0, 0, 0))


class FakeWorker:
    """A model instance's stand-in: the spec's three DEALER identities, on a thread of the test
    process, and a ``sleep`` child as its process."""

    def __init__(self, spec: WorkerSpec, behaviour: Behaviour, context: zmq.Context[Any]) -> None:
        self.spec = spec
        self.behaviour = behaviour
        self.batches: list[Batch] = []
        self.control: list[Message] = []  # what came on the control socket
        self.process = subprocess.Popen(["sleep", "3600"])
        self._context = context
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fake {spec.instance_name}",
                                        daemon=True)
        self._thread.start()

    def _socket(self, suffix: str) -> zmq.Socket[Any]:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, (self.spec.identity + suffix).encode())
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.spec.broker_endpoint)
        return sock

    def _run(self) -> None:
        main, stream, control = self._socket(""), self._socket("#s"), self._socket("#c")
        poller = zmq.Poller()
        poller.register(main, zmq.POLLIN)
        poller.register(control, zmq.POLLIN)
        main.send_multipart(encode(WorkerReady(self.spec.identity, self.process.pid)))
        next_beat = 0.0
        try:
            while not self._stop.is_set() and self.process.poll() is None:
                if time.monotonic() >= next_beat:  # as a live worker's control thread does
                    control.send_multipart(encode(Heartbeat(self.process.pid)))
                    next_beat = time.monotonic() + HEARTBEAT_INTERVAL_S
                for sock, _ in poller.poll(20):
                    message = decode(sock.recv_multipart())
                    if sock is control:
                        self.control.append(message)
                        if isinstance(message, CollectCustomMetrics):
                            control.send_multipart(encode(CustomMetricsSnapshot(
                                message.token, [])))
                    elif isinstance(message, Batch):
                        self.batches.append(message)
                        result = self.behaviour(self, message)
                        if result is not None:
                            main.send_multipart(encode(result))
                    elif isinstance(message, WorkerShutdown):
                        self.process.terminate()
        finally:
            for sock in (main, stream, control):
                sock.close()

    def kill(self) -> None:
        """The worker dies (SIGKILL of its process): the broker sees it on the pidfd."""
        self.process.kill()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait(timeout=5)


class BrokerHarness:
    def __init__(self, root: pathlib.Path, models: dict[str, str],
                 behaviour: Behaviour = answer_all, **settings: Any) -> None:
        """``models``: name -> config.pbtxt text (python models; no model file is read)."""
        repo = root / "models"
        for name, config in models.items():
            (repo / name / "1").mkdir(parents=True)
            (repo / name / "config.pbtxt").write_text(textwrap.dedent(config))
        runtime = root / "run"
        runtime.mkdir()
        self.settings = settings_from_flags(model_repositories=[str(repo)],
                                            runtime_dir=str(runtime), instance_id=new_instance_id(),
                                            **settings).for_broker()
        self.behaviour = behaviour
        self.workers: list[FakeWorker] = []
        self.context: zmq.Context[Any] = zmq.Context()
        self.loop = BrokerLoop(self.settings, ModelManager(self.settings), self._spawn)
        self._stop = threading.Event()
        self._requests = itertools.count(1)
        self._inbox: queue.Queue[Message] = queue.Queue()
        self._frontend = self.context.socket(zmq.DEALER)
        self._frontend.setsockopt(zmq.IDENTITY, b"fe-test")
        self._frontend.setsockopt(zmq.LINGER, 0)
        self._frontend.connect(f"ipc://{runtime}/frontend.sock")
        self._frontend_lock = threading.Lock()
        self.loop.start_all(time.monotonic())
        self._thread = threading.Thread(target=self._run, name="broker loop", daemon=True)
        self._thread.start()
        self._reader = threading.Thread(target=self._read, name="frontend", daemon=True)
        self._send(Hello("test", 0))  # frontend 0: the one /metrics scrapes come from

    def _spawn(self, spec: WorkerSpec, now: float) -> WorkerHandle:
        worker = FakeWorker(spec, self.behaviour, self.context)
        self.workers.append(worker)
        pidfd = os.pidfd_open(worker.process.pid)
        return WorkerHandle(spec=spec, process=worker.process, pidfd=pidfd, started_at=now)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.loop.poll_once()

    def _read(self) -> None:
        while not self._stop.is_set():
            with self._frontend_lock:
                if self._frontend.poll(0):
                    message = decode(self._frontend.recv_multipart())
                    for one in (message.responses if isinstance(message, InferResponseBatch)
                                else [message]):
                        self._inbox.put(one)
                    continue
            time.sleep(0.002)

    def _send(self, message: Message) -> None:
        with self._frontend_lock:
            self._frontend.send_multipart(encode(message))
        if not self._reader.is_alive():
            self._reader.start()

    # ------------------------------------------------------------------ what tests call

    def wait_ready(self, model: str, timeout: float = 10.0) -> None:
        """Until a repository snapshot shows ``model`` READY (every instance loaded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = self.next_message(deadline - time.monotonic())
            if isinstance(message, RepositorySnapshot) and any(
                    v.name == model and v.state is ModelVersionState.READY
                    for v in message.models):
                return
        raise AssertionError(f"model {model} did not become ready")

    def infer(self, model: str, **fields: Any) -> int:
        """Send an InferRequest (no input tensors); returns its request id."""
        request_id = next(self._requests)
        self._send(InferRequest(request_id, model, -1, [], **fields))
        return request_id

    def cancel(self, request_id: int) -> None:
        from shoal.messages import CancelRequest

        self._send(CancelRequest(request_id))

    def stats(self, custom_metrics: bool = False) -> StatsReply:
        from shoal.messages import StatsRequest

        query = next(self._requests)
        self._send(StatsRequest(query, custom_metrics=custom_metrics))
        return self.wait_for(lambda m: isinstance(m, StatsReply) and m.query_id == query)

    def next_message(self, timeout: float = 10.0) -> Message | None:
        try:
            return self._inbox.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def wait_for(self, match: Callable[[Message], bool], timeout: float = 10.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = self.next_message(deadline - time.monotonic())
            if message is not None and match(message):
                return message
        raise AssertionError("no matching message from the broker")

    def answers(self, count: int, timeout: float = 10.0) -> dict[int, InferResponse]:
        """The next ``count`` final answers, by request id."""
        got: dict[int, InferResponse] = {}
        while len(got) < count:
            answer = self.wait_for(lambda m: isinstance(m, InferResponse) and m.final, timeout)
            got[answer.request_id] = answer
        return got

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self._reader.is_alive():
            self._reader.join(timeout=5)
        for worker in self.workers:
            worker.stop()
        self.loop.kill_remaining()
        self.loop.close()
        self._frontend.close()
        self.context.term()


@contextlib.contextmanager
def broker(root: pathlib.Path, models: dict[str, str], behaviour: Behaviour = answer_all,
           **settings: Any) -> Iterator[BrokerHarness]:
    harness = BrokerHarness(root, models, behaviour, **settings)
    try:
        yield harness
    finally:
        harness.close()
