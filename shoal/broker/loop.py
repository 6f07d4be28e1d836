"""The broker's event loop: one thread over two ROUTER sockets and the workers' pidfds.

Frontends send InferRequests; the loop hands them to the model version's scheduler, dispatches
batches to idle workers, forwards each Result to the owning frontend, fails the requests of a
worker that died, and restarts it with back-off. Scheduling decisions are the schedulers' (pure);
this module only moves messages and keeps time.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Mapping

import zmq

from shoal.broker.ensemble_driver import ENSEMBLE_LEASE, INTERNAL, EnsembleDriver
from shoal.broker.model_runtime import InstanceSlot, ModelVersionRuntime
from shoal.broker.models import ModelManager
from shoal.broker.pool import WorkerHandle, WorkerState, reap, restart_delay, spawn_worker
from shoal.broker.schedulers.base import RequestKey
from shoal.errors import ErrorCode
from shoal.messages import (
    Batch,
    BatchResult,
    CancelExecuting,
    CancelRequest,
    Error,
    Hello,
    InferRequest,
    InferRequestBatch,
    InferResponse,
    InferResponseBatch,
    InlineTensor,
    Lease,
    Message,
    ReleaseLeases,
    StateBinding,
    StatsReply,
    StatsRequest,
    StreamResponse,
    UnknownMessage,
    WorkerLoadFailed,
    WorkerReady,
    WorkerRequest,
    WorkerShutdown,
    WrittenState,
    decode,
    encode,
)
from shoal.settings import Settings
from shoal.shm.sweep import remove_segments_with_prefix

logger = logging.getLogger(__name__)

_MAX_WAIT_S = 0.5


class BrokerLoop:
    def __init__(self, settings: Settings, models: ModelManager) -> None:
        self.settings = settings
        self.models = models
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.frontends = self.context.socket(zmq.ROUTER)
        self.frontends.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.frontends.bind(f"ipc://{settings.runtime_dir}/frontend.sock")
        self.workers = self.context.socket(zmq.ROUTER)
        self.workers.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.worker_endpoint = f"ipc://{settings.runtime_dir}/worker.sock"
        self.workers.bind(self.worker_endpoint)
        self.poller = zmq.Poller()
        self.poller.register(self.frontends, zmq.POLLIN)
        self.poller.register(self.workers, zmq.POLLIN)
        self.handles: dict[str, tuple[WorkerHandle, ModelVersionRuntime, InstanceSlot]] = {}
        self.by_pidfd: dict[int, str] = {}
        self.known_frontends: set[bytes] = set()
        # answers produced in this loop pass, per frontend; sent as one message by flush_answers
        self.answers: dict[bytes, list[InferResponse]] = defaultdict(list)
        self.snapshot_dirty = False
        self.next_batch_id = 1
        self.next_exec_id = 1
        self.spawn_counter = 0
        self.stopping = False
        self.ensembles = EnsembleDriver(self.submit, self.answer, self.forward_releases,
                                        self.cancel)

    # ------------------------------------------------------------------ lifecycle

    def start_all(self, now: float) -> None:
        for runtime in self.models.runtimes():
            for slot in runtime.instances:
                self.spawn(runtime, slot, now)

    def spawn(self, runtime: ModelVersionRuntime, slot: InstanceSlot, now: float) -> None:
        self.spawn_counter += 1
        spec = self.models.worker_spec(runtime, slot, self.spawn_counter, self.worker_endpoint)
        handle = spawn_worker(spec, now)
        slot.worker, slot.restart_at = handle, None
        self.handles[spec.identity] = (handle, runtime, slot)
        if handle.pidfd is not None:
            self.by_pidfd[handle.pidfd] = spec.identity
            self.poller.register(handle.pidfd, zmq.POLLIN)
        runtime.refresh_state()
        self.snapshot_dirty = True

    def initial_load_done(self) -> bool:
        return all(s.ever_ready or s.gave_up for r in self.models.runtimes() for s in r.instances)

    def poll_once(self) -> None:
        # Dispatch and compute the sleep from the same instant: a scheduler reports no deadline
        # when its batch is ready now, so anything that became ready since the last dispatch
        # must be sent before we sleep (else it would wait for the next message or _MAX_WAIT_S).
        now = time.monotonic()
        self.tick(now)
        self.flush_answers()
        timeout = self.next_timeout(now)
        # zmq polls in whole milliseconds: a sub-millisecond wait (a batcher's µs queue delay)
        # polls without blocking until it is due, instead of rounding up to a full millisecond.
        timeout_ms = math.ceil(timeout * 1000) if timeout >= 0.001 else 0
        for sock, _ in self.poller.poll(timeout_ms):
            if sock is self.frontends:
                self.drain_frontends()
            elif sock is self.workers:
                self.drain_workers()
            elif isinstance(sock, int) and sock in self.by_pidfd:
                self.on_worker_exit(self.by_pidfd[sock])
        self.tick(time.monotonic())
        self.flush_answers()

    def next_timeout(self, now: float) -> float:
        deadline = now + _MAX_WAIT_S
        for runtime in self.models.runtimes():
            d = (runtime.sequence.deadline(now) if runtime.sequence is not None
                 else runtime.scheduler.next_deadline(now))
            if d is not None:
                deadline = min(deadline, d)
            for slot in runtime.instances:
                if slot.restart_at is not None:
                    deadline = min(deadline, slot.restart_at)
        return max(0.0, deadline - now)

    def tick(self, now: float) -> None:
        for runtime in self.models.runtimes():
            expired = (runtime.sequence.expire(now) if runtime.sequence is not None
                       else runtime.scheduler.expire(now))
            for rejection in expired:
                self.finish_error(runtime, rejection.request.key,
                                  Error(rejection.code, rejection.message), "REJECTED", now)
            for slot in runtime.instances:
                if slot.restart_at is not None and slot.restart_at <= now and not self.stopping:
                    self.spawn(runtime, slot, now)
            self.dispatch(runtime, now)
        if self.snapshot_dirty:
            self.broadcast_snapshot()

    # ------------------------------------------------------------------ frontends

    def drain_frontends(self) -> None:
        while True:
            try:
                frames = self.frontends.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            identity = frames[0]
            try:
                message = decode(frames[1:])
            except UnknownMessage as exc:
                logger.warning("dropping malformed frontend message: %s", exc)
                continue
            self.on_frontend_message(identity, message)

    def on_frontend_message(self, identity: bytes, message: Message) -> None:
        now = time.monotonic()
        if isinstance(message, InferRequest):
            self.submit(identity, message, now)
        elif isinstance(message, InferRequestBatch):
            for request in message.requests:
                self.submit(identity, request, now)
        elif isinstance(message, ReleaseLeases):
            self.forward_releases(message.leases)
        elif isinstance(message, CancelRequest):
            self.cancel(identity, message.request_id, now)
        elif isinstance(message, Hello):
            self.known_frontends.add(identity)
            self.send_frontend(identity, self.models.snapshot(self.stopping))
        elif isinstance(message, StatsRequest):
            models = self.models.stats(message.model, message.version)
            self.send_frontend(identity, StatsReply(message.query_id, models))

    def submit(self, identity: bytes, request: InferRequest, now: float) -> None:
        runtime = self.models.runtime(request.model, request.version)
        if runtime is None or self.stopping or not runtime.serving():
            reason = ("Server exiting" if self.stopping else
                      f"model '{request.model}' version {request.version} is not available")
            self.answer(identity, InferResponse(
                request.request_id, error=Error(ErrorCode.UNAVAILABLE, reason)))
            return
        if runtime.ensemble is not None:
            self.ensembles.start(identity, request, runtime, now)
            return
        key: RequestKey = (identity, request.request_id)
        queued = runtime.queued(key, identity, request, now)
        if runtime.sequence is not None:
            rejection = runtime.sequence.submit(key, request, now, queued.shape_signature)
        else:
            rejection = runtime.scheduler.submit(queued, now)
        if rejection is not None:
            self.finish_error(runtime, key, Error(rejection.code, rejection.message),
                              "REJECTED", now)
            return
        self.dispatch(runtime, now)

    def cancel(self, identity: bytes, request_id: int, now: float) -> None:
        """Queued: dropped at once (never reaches a batch). Running: the worker is told, the
        model sees is_cancelled(); its answer still ends the request."""
        if self.ensembles.cancel(identity, request_id, now):
            return
        key: RequestKey = (identity, request_id)
        for runtime in self.models.runtimes():
            pending = runtime.requests.get(key)
            if pending is None:
                continue
            if runtime.sequence is not None and not pending.worker:
                for ended in runtime.sequence.cancel(key, now):  # its queued sequence ends
                    self.finish_error(runtime, ended, Error(ErrorCode.CANCELLED,
                                                            "request cancelled"), "CANCELED", now)
            elif runtime.scheduler.cancel(key) is not None:
                self.finish_error(runtime, key, Error(ErrorCode.CANCELLED, "request cancelled"),
                                  "CANCELED", now)
            elif pending.worker:
                self.send_worker(pending.worker + "#c", CancelExecuting([pending.exec_id]))
            return

    def forward_releases(self, leases: list[Lease]) -> None:
        grouped: dict[str, list[Lease]] = defaultdict(list)
        for lease in leases:
            grouped[lease.instance].append(lease)
        ensemble_runs = grouped.pop(ENSEMBLE_LEASE, [])
        if ensemble_runs:
            self.ensembles.release([lease.lease_id for lease in ensemble_runs])
        for instance, group in grouped.items():
            entry = self.handles.get(instance)
            if entry is not None and entry[0].state is not WorkerState.DEAD:
                self.send_worker(instance, ReleaseLeases(group))

    def answer(self, identity: bytes, response: InferResponse) -> None:
        """Queue a terminal answer; flush_answers sends it at the end of this loop pass."""
        self.answers[identity].append(response)

    def flush_answers(self) -> None:
        now = time.monotonic()
        while INTERNAL in self.answers:  # answers to ensemble steps feed their runs, which
            for response in self.answers.pop(INTERNAL):  # may answer more (bounded by the DAG)
                self.ensembles.on_answer(response, now)
        if not self.answers:
            return
        answers, self.answers = self.answers, defaultdict(list)
        for identity, responses in answers.items():
            self.send_frontend(identity, responses[0] if len(responses) == 1
                               else InferResponseBatch(responses))

    def send_frontend(self, identity: bytes, message: Message) -> None:
        try:
            self.frontends.send_multipart([identity, *encode(message)])
        except zmq.ZMQError as exc:  # frontend gone (EHOSTUNREACH with ROUTER_MANDATORY)
            # expected while stopping: the frontend exits first and the broker says goodbye
            (logger.debug if self.stopping else logger.warning)(
                "cannot reach frontend %r: %s", identity, exc)
            self.known_frontends.discard(identity)
            responses = (message.responses if isinstance(message, InferResponseBatch)
                         else [message] if isinstance(message, InferResponse) else [])
            self.forward_releases([r.lease for r in responses if r.lease is not None])

    def broadcast_snapshot(self) -> None:
        self.snapshot_dirty = False
        snapshot = self.models.snapshot(self.stopping)
        for identity in list(self.known_frontends):
            self.send_frontend(identity, snapshot)

    # ------------------------------------------------------------------ scheduling

    def dispatch(self, runtime: ModelVersionRuntime, now: float) -> None:
        if runtime.sequence is not None:
            self.dispatch_sequences(runtime, now)
            return
        for worker in runtime.idle_workers():
            batch = runtime.scheduler.next_batch(now)
            if not batch:
                return
            self.send_batch(runtime, worker, [q.key for q in batch], now)

    def dispatch_sequences(self, runtime: ModelVersionRuntime, now: float) -> None:
        assert runtime.sequence is not None
        for index, slot in enumerate(runtime.instances):
            worker = slot.worker
            if worker is None or worker.state is not WorkerState.IDLE:
                continue
            work = runtime.sequence.work_for(index, self.next_batch_id, now)
            if work is None:
                continue
            if work.error is not None:
                self.next_batch_id += 1
                error = Error(work.error.code, work.error.message)
                for key in work.keys:
                    self.finish_error(runtime, key, error, "OTHER", now)
                continue
            self.send_batch(runtime, worker, work.keys, now, work.rows, work.controls,
                            work.states)

    def send_batch(self, runtime: ModelVersionRuntime, worker: WorkerHandle,
                   keys: list[RequestKey], now: float, rows: list[int] | None = None,
                   controls: list[InlineTensor] | None = None,
                   states: Mapping[RequestKey, list[StateBinding]] | None = None) -> None:
        """Hand these queued requests to an idle worker as one Batch."""
        batch_id = self.next_batch_id
        self.next_batch_id += 1
        requests: list[WorkerRequest] = []
        for key in keys:
            pending = runtime.requests[key]
            pending.dispatched, pending.worker = now, worker.identity
            pending.exec_id = self.next_exec_id
            self.next_exec_id += 1
            runtime.by_exec[pending.exec_id] = key
            r = pending.request
            requests.append(WorkerRequest(
                request_id=pending.exec_id, inputs=r.inputs, outputs=r.outputs,
                parameters=r.parameters, client_request_id=r.client_request_id,
                batch_size=r.batch_size, correlation_id=r.correlation_id, flags=r.flags,
                states=states.get(key, []) if states else []))
            runtime.stats.record_queue(int((now - pending.arrival) * 1e9))
        if runtime.orderer is not None:
            runtime.orderer.admit(keys)
        runtime.batches[batch_id] = keys
        worker.state, worker.batch_id = WorkerState.BUSY, batch_id
        self.send_worker(worker.identity, Batch(batch_id, requests, rows or [],
                                                controls or []))

    def send_worker(self, identity: str, message: Message) -> None:
        try:
            self.workers.send_multipart([identity.encode(), *encode(message)])
        except zmq.ZMQError as exc:
            logger.warning("cannot reach worker %s: %s", identity, exc)

    # ------------------------------------------------------------------ workers

    def drain_workers(self) -> None:
        while True:
            try:
                frames = self.workers.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            identity = frames[0].decode().removesuffix("#s")
            entry = self.handles.get(identity)
            if entry is None:
                continue
            try:
                message = decode(frames[1:])
            except UnknownMessage as exc:
                logger.warning("dropping malformed worker message: %s", exc)
                continue
            self.on_worker_message(entry, message, time.monotonic())

    def on_worker_message(self, entry: tuple[WorkerHandle, ModelVersionRuntime, InstanceSlot],
                          message: Message, now: float) -> None:
        handle, runtime, slot = entry
        if isinstance(message, BatchResult):
            self.on_batch_result(handle, runtime, message, now)
        elif isinstance(message, StreamResponse):
            self.on_stream_response(handle, runtime, message, now)
        elif isinstance(message, WorkerReady):
            if self.stopping:  # it connected after the shutdown broadcast
                handle.state = WorkerState.STOPPING
                self.send_worker(handle.identity, WorkerShutdown("server exiting"))
                return
            handle.state, handle.ready_at = WorkerState.IDLE, now
            slot.ever_ready, slot.last_exit = True, ""
            logger.info("model %s version %d instance %s ready (pid %d)", runtime.name,
                        runtime.version, slot.instance_name, handle.pid)
            runtime.refresh_state()
            self.snapshot_dirty = True
            self.dispatch(runtime, now)
        elif isinstance(message, WorkerLoadFailed):
            slot.last_exit = f"failed to load: {message.message}"
            runtime.reason = f"model instance '{slot.instance_name}' failed to load: " \
                             f"{message.message}"
            handle.state = WorkerState.STOPPING  # it exits by itself; on_worker_exit follows

    def on_batch_result(self, handle: WorkerHandle, runtime: ModelVersionRuntime,
                        message: BatchResult, now: float) -> None:
        keys = runtime.batches.pop(message.batch_id, [])
        if runtime.sequence is not None:
            runtime.sequence.done(message.batch_id, now, written_states(runtime, keys, message))
        if handle.batch_id == message.batch_id:
            handle.state, handle.batch_id = WorkerState.IDLE, None
        by_exec = {r.request_id: r for r in message.results}
        rows = sum(runtime.requests[k].request.batch_size for k in keys if k in runtime.requests)
        runtime.stats.record_execution(rows, len(keys), message.timings)
        for key in keys:
            exec_id = runtime.requests[key].exec_id if key in runtime.requests else 0
            result = by_exec.get(exec_id)
            if runtime.decoupled and result is None:
                if key in runtime.requests:
                    handle.streams.add(exec_id)  # answers keep coming as StreamResponses
                continue
            pending = runtime.forget(key)
            if pending is None:
                continue
            if pending.frontend == INTERNAL:  # an ensemble step: its durations count there too
                self.ensembles.on_step_timings(key[1], message.timings)
            elapsed = int((now - pending.arrival) * 1e9)
            if result is None:
                error = Error(ErrorCode.INTERNAL, "worker returned no result for the request")
                response = InferResponse(key[1], error=error)
                runtime.stats.record_failure(elapsed, "BACKEND")
            elif result.error is not None:
                response = InferResponse(key[1], error=result.error)
                runtime.stats.record_failure(elapsed, "BACKEND")
            else:
                response = InferResponse(key[1], runtime.version, result.outputs,
                                         result.parameters, None, message.lease)
                runtime.stats.record_success(elapsed)
            self.deliver(runtime, key, pending.frontend, response)
        self.dispatch(runtime, now)

    def on_stream_response(self, handle: WorkerHandle, runtime: ModelVersionRuntime,
                           message: StreamResponse, now: float) -> None:
        key = runtime.by_exec.get(message.request_id)
        pending = runtime.requests.get(key) if key is not None else None
        if key is None or pending is None:  # already ended (e.g. failed): give the memory back
            if message.lease is not None:
                self.forward_releases([message.lease])
            return
        response = InferResponse(key[1], runtime.version, message.outputs, message.parameters,
                                 message.error, message.lease, message.final, message.empty)
        self.answer(pending.frontend, response)
        if message.final:
            runtime.forget(key)
            handle.streams.discard(message.request_id)
            elapsed = int((now - pending.arrival) * 1e9)
            if message.error is None:
                runtime.stats.record_success(elapsed)
            else:
                runtime.stats.record_failure(elapsed, "BACKEND")

    def deliver(self, runtime: ModelVersionRuntime, key: RequestKey, frontend: bytes,
                response: InferResponse) -> None:
        if runtime.orderer is None:
            self.answer(frontend, response)
            return
        for ready_key, ready in runtime.orderer.complete(key, response):
            self.answer(ready_key[0], ready)

    def finish_error(self, runtime: ModelVersionRuntime, key: RequestKey, error: Error,
                     reason: str, now: float) -> None:
        pending = runtime.forget(key)
        if pending is None:
            return
        runtime.stats.record_failure(int((now - pending.arrival) * 1e9), reason)
        response = InferResponse(key[1], error=error)
        if runtime.orderer is not None and pending.dispatched:
            self.deliver(runtime, key, pending.frontend, response)
        else:
            self.answer(pending.frontend, response)

    def on_worker_exit(self, identity: str) -> None:
        now = time.monotonic()
        handle, runtime, slot = self.handles.pop(identity)
        if handle.pidfd is not None:
            self.poller.unregister(handle.pidfd)
            self.by_pidfd.pop(handle.pidfd, None)
        reap(handle, timeout=1.0)
        expected = handle.state is WorkerState.STOPPING and slot.last_exit == ""
        description = handle.exit_description()
        remove_segments_with_prefix(handle.spec.arena_prefix)
        error = Error(ErrorCode.INTERNAL,
                      f"model instance '{slot.instance_name}' of model '{runtime.name}' "
                      f"version {runtime.version} (pid {handle.pid}) {description} while "
                      "executing the request")
        keys = runtime.batches.pop(handle.batch_id, []) if handle.batch_id is not None else []
        keys += [runtime.by_exec[e] for e in handle.streams if e in runtime.by_exec]
        if runtime.sequence is not None:  # sequences without implicit state end with it
            keys += runtime.sequence.fail_instance(runtime.instances.index(slot),
                                                   handle.batch_id, now)
        for key in keys:
            self.finish_error(runtime, key, error, "BACKEND", now)
        handle.state = WorkerState.DEAD
        if slot.worker is handle:
            slot.worker = None
        if self.stopping or expected:
            return
        logger.error("model %s instance %s (pid %d) %s", runtime.name, slot.instance_name,
                     handle.pid, description)
        if not slot.last_exit:
            slot.last_exit = description
        served = now - handle.ready_at if handle.ready_at is not None else 0.0
        slot.failures = 0 if served >= 60.0 else slot.failures + 1
        if not slot.ever_ready or runtime.gave_up_on(slot):
            slot.gave_up = True
            runtime.reason = runtime.reason or f"model instance '{slot.instance_name}' " \
                                               f"{slot.last_exit}"
            if not runtime.serving():
                self.fail_queued(runtime, now)
        else:
            slot.restart_at = now + restart_delay(slot.failures - 1, served)
        runtime.refresh_state()
        self.snapshot_dirty = True

    def fail_queued(self, runtime: ModelVersionRuntime, now: float) -> None:
        error = Error(ErrorCode.UNAVAILABLE,
                      f"model '{runtime.name}' version {runtime.version} is not available: "
                      f"{runtime.reason}")
        for key in runtime.drain_queue():
            self.finish_error(runtime, key, error, "OTHER", now)

    # ------------------------------------------------------------------ shutdown

    def begin_shutdown(self) -> None:
        """Refuse new work, fail what is queued, ask every worker to finalize and exit."""
        if self.stopping:
            return
        self.stopping = True
        now = time.monotonic()
        for runtime in self.models.runtimes():
            error = Error(ErrorCode.UNAVAILABLE, "Server exiting")
            for key in runtime.drain_queue():
                self.finish_error(runtime, key, error, "OTHER", now)
            for slot in runtime.instances:
                slot.restart_at = None
        for identity, (handle, _runtime, _slot) in self.handles.items():
            if handle.state is not WorkerState.DEAD:
                loading = handle.state is WorkerState.LOADING
                handle.state = WorkerState.STOPPING
                if not loading:  # a loading worker is told when its WorkerReady arrives
                    self.send_worker(identity, WorkerShutdown("server exiting"))
        self.snapshot_dirty = True

    def workers_alive(self) -> bool:
        return bool(self.handles)

    def kill_remaining(self) -> None:
        for identity in list(self.handles):
            handle = self.handles[identity][0]
            if handle.process.poll() is None:
                logger.warning("worker %s did not exit in time; killing it",
                               handle.spec.instance_name)
                handle.process.kill()
            self.on_worker_exit(identity)

    def close(self) -> None:
        for runtime in self.models.runtimes():
            if runtime.sequence is not None:
                runtime.sequence.close()
        self.frontends.close(linger=0)
        self.workers.close(linger=0)


def written_states(runtime: ModelVersionRuntime, keys: list[RequestKey], message: BatchResult
                   ) -> dict[RequestKey, list[WrittenState]]:
    """The output states each successful request of a sequence batch wrote."""
    by_exec = {r.request_id: r for r in message.results if r.states and r.error is None}
    written: dict[RequestKey, list[WrittenState]] = {}
    for key in keys:
        pending = runtime.requests.get(key)
        result = by_exec.get(pending.exec_id) if pending is not None else None
        if result is not None:
            written[key] = result.states
    return written
