"""The broker's event loop: one thread over two ROUTER sockets and the workers' pidfds.

Frontends send InferRequests; the loop routes each message to its collaborator and keeps time:
``intake`` queues requests on their version's scheduling (``schedulers/scheduling.py``, whose
decisions are pure), ``dispatcher`` sends idle workers their work, ``batch_results`` /
``stream_results`` say what answers mean, ``answers`` sends them, ``instance_deaths`` /
``instance_control`` follow the workers' lives (restarts with back-off), ``release_routing``
returns leases, ``queries`` answers statistics. The sockets live in ``frontend_link`` and
``worker_link``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import msgspec
import zmq

from shoal.broker.answers import Answers
from shoal.broker.batch_results import batch_outcomes, reschedule, written_states
from shoal.broker.dispatcher import Dispatcher
from shoal.broker.ensemble.driver import INTERNAL, EnsembleDriver
from shoal.broker.frontend_link import FrontendLink
from shoal.broker.health import HealthTimer, note_progress
from shoal.broker.held_releases import HeldReleases
from shoal.broker.instance_control import (
    kill_unfinished,
    mark_load_failed,
    mark_ready,
    record_heartbeat,
    stop_everything,
)
from shoal.broker.instance_deaths import end_instance, release_dead_worker
from shoal.broker.intake import RequestIntake
from shoal.broker.lifecycle.driver import LifecycleDriver
from shoal.broker.model_runtime import InstanceSlot, ModelVersionRuntime, earliest_deadline
from shoal.broker.models import ModelManager
from shoal.broker.pool import WorkerHandle, WorkerState, spawn_worker
from shoal.broker.queries import StatsDesk
from shoal.broker.rate_limiter import RateLimiter
from shoal.broker.release_routing import ReleaseRouting
from shoal.broker.short_wait import wait_briefly
from shoal.broker.stream_results import stream_answer
from shoal.broker.worker_link import WorkerEntry, WorkerLink
from shoal.errors import ErrorCode
from shoal.messages import (
    BatchResult,
    CacheFigures,
    CancelRequest,
    ControlReply,
    CustomMetricsSnapshot,
    Error,
    ForgetCudaHandles,
    Heartbeat,
    Hello,
    InferRequest,
    InferRequestBatch,
    Lease,
    LoadModel,
    LogLevel,
    Message,
    RegionRegistered,
    RegionUnregistered,
    ReleaseLeases,
    StatsRequest,
    StreamResponse,
    StreamResponses,
    UnloadModel,
    WorkerLoadFailed,
    WorkerReady,
    WorkerSpec,
)
from shoal.settings import BrokerSettings

logger = logging.getLogger(__name__)

_MAX_WAIT_S = 0.5
# Housekeeping that need not run on every pass of the loop (every pass is per message under
# load): the model lifecycle (promotions, drains, polls) runs at least this often and at once
# after a worker or control event; the workers' health is checked this often.
_LIFECYCLE_PERIOD_S = 0.05
_HEALTH_PERIOD_S = 0.25


WorkerSpawner = Callable[[WorkerSpec, float], WorkerHandle]


class BrokerLoop:
    def __init__(self, settings: BrokerSettings, models: ModelManager,
                 spawn_worker: WorkerSpawner = spawn_worker) -> None:
        """``spawn_worker`` starts a model instance's process (``pool.spawn_worker``); the
        in-process test harness (``tests/broker/harness.py``) passes one that starts a stand-in
        speaking the worker protocol from the test process."""
        self.settings = settings
        self.spawn_worker = spawn_worker
        self.models = models
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.frontends = FrontendLink(self.context, f"ipc://{settings.instance.runtime_dir}/frontend.sock",
                                      self.forward_releases)
        self.answers = Answers(self.frontends)
        self.answer, self.finish_error = self.answers.answer, self.answers.finish_error
        self.worker_endpoint = f"ipc://{settings.instance.runtime_dir}/worker.sock"
        self.poller = zmq.Poller()
        self.poller.register(self.frontends.socket, zmq.POLLIN)
        self.workers = WorkerLink(self.context, self.worker_endpoint, self.poller)
        # lease releases for workers, riding on their next Batch (held_releases.py)
        self.held_releases = HeldReleases()
        self.releases = ReleaseRouting(self.workers, self.held_releases)
        self.snapshot_dirty = False
        self.spawn_counter = 0
        self.stopping = False
        self.log_level: LogLevel | None = None  # the logging API's last change, for new workers
        self.health = HealthTimer(_HEALTH_PERIOD_S, _MAX_WAIT_S + 1.0, time.monotonic())
        self.lifecycle_due = 0.0  # 0: run the lifecycle on the next pass
        self.wake_by: float | None = None  # set by settle(); None: settle before polling
        self.lifecycle_deadline: float | None = None  # its next deadline, as of its last run
        # --rate-limit execution_count: batches start only when granted (rate_limiter/)
        self.dispatcher = Dispatcher(
            self.workers, self.held_releases,
            RateLimiter(settings.rate_limit.resources)
            if settings.rate_limit.mode == "execution_count" else None, self.finish_error)
        self.intake = RequestIntake(models, self.workers, self.answer, self.finish_error,
                                    self.dispatcher.dispatch)
        self.ensembles = EnsembleDriver(self.intake.submit, self.answer, self.forward_releases,
                                        self.intake.cancel)
        self.intake.ensembles = self.ensembles
        self.releases.ensemble_release = self.ensembles.release
        self.lifecycle = LifecycleDriver(settings, models, self)
        self.stats = StatsDesk(models, self.workers, self.frontends, self.ensembles.in_flight,
                               self.lifecycle.ledger)
        self.poller.register(self.lifecycle.wake_fd, zmq.POLLIN)

    # ------------------------------------------------------------------ lifecycle

    def start_all(self, now: float) -> None:
        """The start-up loads of the model control mode (none / poll: every model; explicit:
        the --load-model ones)."""
        self.lifecycle.start(now)

    def spawn(self, runtime: ModelVersionRuntime, slot: InstanceSlot, now: float) -> None:
        self.spawn_counter += 1
        spec = self.models.worker_spec(runtime, slot, self.spawn_counter, self.worker_endpoint)
        if self.log_level is not None:  # the logging API changed it: the worker starts at it
            spec = msgspec.structs.replace(spec, log_level=self.log_level.level)
        handle = self.spawn_worker(spec, now)
        slot.worker, slot.restart_at = handle, None
        self.workers.add(handle, runtime, slot)
        runtime.refresh_state()
        self.snapshot_dirty = True
        self.dispatcher.refresh_rate_limits(self.models.runtimes())

    def initial_load_done(self) -> bool:
        return self.lifecycle.initial_done()

    def stop_workers(self, runtime: ModelVersionRuntime, kill: bool) -> None:
        """LifecycleHooks (see WorkerLink.stop_instances)."""
        self.workers.stop_instances(runtime.instances, kill)

    def poll_once(self) -> None:
        """One pass: wait for a message or the settled deadline, handle what came, settle."""
        if self.wake_by is None:  # first pass, or something ran outside a pass since
            self.settle(time.monotonic())
            assert self.wake_by is not None
        timeout = max(0.0, self.wake_by - time.monotonic())
        # zmq polls in whole milliseconds: a sub-millisecond wait (a batcher's µs queue delay)
        # sleeps in select() instead (short_wait.py), then polls without blocking; rounding it up
        # to a full millisecond would make the batch late.
        timeout_ms = math.ceil(timeout * 1000) if timeout >= 0.001 else 0
        if 0 < timeout < 0.001:
            wait_briefly((self.frontends.socket, self.workers.socket),
                         (self.lifecycle.wake_fd, *self.workers.pidfds()), timeout)
        for sock, _ in self.poller.poll(timeout_ms):
            if sock is self.frontends.socket:
                for identity, message in self.frontends.receive():
                    self.on_frontend_message(identity, message)
            elif sock is self.workers.socket:
                for entry, message in self.workers.receive():
                    self.on_worker_message(entry, message, time.monotonic())
            elif sock == self.lifecycle.wake_fd:
                self.lifecycle.on_wake(time.monotonic())
                self.lifecycle_due = 0.0
            elif (exited := self.workers.exited(sock)) is not None:
                self.on_worker_exit(exited)
        self.check_health(time.monotonic())  # after reading: heartbeats waiting are counted
        self.settle(time.monotonic())

    def settle(self, now: float) -> None:
        """End of a pass: run what is due at ``now``, send what that produced, and set
        ``wake_by`` from the same instant (a scheduler reports no deadline when its batch is
        ready now, so anything that became ready since the last dispatch must be sent before
        the loop sleeps, else it would wait for the next message or _MAX_WAIT_S). The next pass
        polls right after this, so it does not settle again first (that was one more tick per
        pass, with nothing new to do)."""
        self.tick(now)
        self.flush_answers()
        self.releases.flush()  # before sleeping: only executing workers' releases stay held
        self.wake_by = self.next_deadline(now)

    def next_deadline(self, now: float) -> float:
        """When the loop must wake at the latest, as of ``now`` (monotonic seconds)."""
        others = (self.lifecycle_deadline, self.stats.next_deadline(), now + _MAX_WAIT_S)
        return earliest_deadline(self.models.runtimes(), now,
                                 min(d for d in others if d is not None))

    def tick(self, now: float) -> None:
        for runtime in self.models.runtimes():
            for rejection in runtime.scheduling.expire(now):
                self.finish_error(runtime, rejection.request.key,
                                  Error(rejection.code, rejection.message), "REJECTED", now)
            for slot in runtime.instances:
                if (slot.restart_at is not None and slot.restart_at <= now
                        and not self.stopping and not runtime.retiring):
                    slot.restarts += 1
                    self.spawn(runtime, slot, now)
            self.dispatcher.dispatch(runtime, now)
        self.stats.expire(now)
        if now >= self.lifecycle_due:
            self.lifecycle.tick(now)
            self.lifecycle_due = now + _LIFECYCLE_PERIOD_S
            self.lifecycle_deadline = self.lifecycle.next_deadline(now, _LIFECYCLE_PERIOD_S)
        if self.lifecycle.dirty:
            self.lifecycle.dirty, self.snapshot_dirty = False, True
        if self.snapshot_dirty:
            self.broadcast_snapshot()
        for waiter, error in self.lifecycle.take_replies():  # after the snapshot they follow
            self.frontends.send(waiter.identity, ControlReply(waiter.query_id, error))

    # ------------------------------------------------------------------ frontends

    def on_frontend_message(self, identity: bytes, message: Message) -> None:
        """Inference requests are only queued here: the tick at the end of this loop pass
        dispatches every model version, so the requests read in one pass meet in the batcher
        and it plans once per pass instead of once per request."""
        now = time.monotonic()
        if isinstance(message, InferRequest):
            self.intake.enqueue(identity, message, now)
        elif isinstance(message, InferRequestBatch):
            if message.releases:  # first: a batch dispatched this pass may carry them
                self.frontends.returned(identity, message.releases)
                self.forward_releases(message.releases)
            for request in message.requests:
                self.intake.enqueue(identity, request, now)
        elif isinstance(message, ReleaseLeases):
            self.frontends.returned(identity, message.leases)
            self.forward_releases(message.leases)
        elif isinstance(message, CancelRequest):
            self.intake.cancel(identity, message.request_id, now)
        elif isinstance(message, ForgetCudaHandles):
            self.workers.send_control_to_all(message)  # each worker unmaps them between batches
        elif isinstance(message, LogLevel):  # the logging API: server-wide, as Triton's
            logging.getLogger().setLevel(message.level)
            self.log_level = message
            self.workers.send_control_to_all(message)
        elif isinstance(message, (LoadModel, UnloadModel)):
            self.lifecycle.on_control(identity, message, now)
            self.lifecycle_due = 0.0
        elif isinstance(message, Hello):
            replaced = self.frontends.greet(identity, message.frontend_index)
            self.frontends.send(identity, self.models.snapshot(self.stopping))
            if replaced is not None:
                self.intake.abandon(replaced, now)
        elif isinstance(message, (RegionRegistered, RegionUnregistered)):
            self.frontends.regions.record(message)
        elif isinstance(message, CacheFigures):
            self.stats.record_cache_figures(message)
        elif isinstance(message, StatsRequest):
            self.stats.on_request(identity, message, now)

    def forward_releases(self, leases: list[Lease]) -> None:
        """Leases their holders gave back (``release_routing``)."""
        self.releases.forward(leases)

    def flush_answers(self) -> None:
        now = time.monotonic()
        # answers to ensemble steps feed their runs, which may answer more (bounded by the DAG)
        while (internal := self.frontends.take(INTERNAL)) is not None:
            for response in internal:
                self.ensembles.on_answer(response, now)
        self.frontends.flush()

    def broadcast_snapshot(self) -> None:
        self.snapshot_dirty = False
        self.frontends.broadcast(self.models.snapshot(self.stopping))
        self.dispatcher.refresh_rate_limits(self.models.runtimes())

    # ------------------------------------------------------------------ workers

    def on_worker_message(self, entry: WorkerEntry,
                          message: Message, now: float) -> None:
        handle, runtime, slot = entry
        if isinstance(message, Heartbeat):
            record_heartbeat(handle, message, now)
        elif isinstance(message, CustomMetricsSnapshot):
            handle.custom_metrics = message.custom_metrics
            self.stats.on_snapshot(handle.identity, message)
        elif isinstance(message, BatchResult):
            self.on_batch_result(handle, runtime, message, now)
        elif isinstance(message, StreamResponse):
            self.on_stream_response(handle, runtime, message, now)
        elif isinstance(message, StreamResponses):
            for response in message.responses:
                self.on_stream_response(handle, runtime, response, now)
        elif isinstance(message, WorkerReady):
            if not mark_ready(handle, runtime, slot, now, self.workers,
                              self.stopping or runtime.retiring, self.log_level):
                return
            self.snapshot_dirty = True
            self.lifecycle_due = 0.0  # a loading generation may be ready now
            self.dispatcher.dispatch(runtime, now)
        elif isinstance(message, WorkerLoadFailed):  # it exits by itself; on_worker_exit follows
            mark_load_failed(handle, runtime, slot, message.message)

    def on_batch_result(self, handle: WorkerHandle, runtime: ModelVersionRuntime,
                        message: BatchResult, now: float) -> None:
        keys, rows, early = runtime.end_batch(message.batch_id)
        if message.rescheduled:
            keys = reschedule(runtime, handle, keys, set(message.rescheduled))
        # an ensemble's steps' queue times (none to look up while no ensemble request runs)
        step_queued = {key[1]: p.queued_ns for key in keys
                       if (p := runtime.requests.get(key)) is not None
                       and p.frontend == INTERNAL} if len(self.ensembles) else {}
        runtime.scheduling.done(message.batch_id, now,
                                lambda: written_states(runtime, keys, message))
        if handle.batch_id == message.batch_id:
            handle.state, handle.batch_id = WorkerState.IDLE, None
            self.dispatcher.batch_done(handle.identity)
        for key, frontend, response in batch_outcomes(runtime, keys, rows, early, message,
                                                      handle.streams, now):
            if frontend == INTERNAL:  # an ensemble step: its durations count there too
                self.ensembles.on_step_timings(key[1], message.timings,
                                               step_queued.get(key[1], 0))
            self.answers.deliver(runtime, key, frontend, response)
        note_progress(handle, now)  # after batch_outcomes: decoupled requests left open owe more
        self.dispatcher.dispatch(runtime, now)

    def on_stream_response(self, handle: WorkerHandle, runtime: ModelVersionRuntime,
                           message: StreamResponse, now: float) -> None:
        outcome = stream_answer(handle, runtime, message, now)
        if isinstance(outcome, tuple):
            self.answer(*outcome)
        elif outcome is not None:  # its request already ended: the memory goes back
            self.forward_releases([outcome])

    def on_worker_exit(self, identity: str) -> None:
        now = time.monotonic()
        handle, runtime, slot = release_dead_worker(identity, self.workers, self.held_releases,
                                                    self.dispatcher, self.frontends)
        restarting = end_instance(handle, runtime, slot, self.finish_error, self.fail_queued,
                                  self.stopping, now)
        self.stats.worker_gone(identity)
        self.lifecycle_due = 0.0  # a load may have failed, a drained version may be gone
        if restarting:
            self.snapshot_dirty = True

    def check_health(self, now: float) -> None:
        """Every _HEALTH_PERIOD_S: kill every worker that is silent or overdue (health.py); its
        exit then fails what it held and restarts it with back-off."""
        if self.health.due(now) and not self.stopping:
            self.workers.kill_overdue(now, self.settings.worker_watch.heartbeat_timeout_secs)

    def fail_queued(self, runtime: ModelVersionRuntime, now: float, message: str = "") -> None:
        error = Error(ErrorCode.UNAVAILABLE, message or
                      f"model '{runtime.name}' version {runtime.version} is not available: "
                      f"{runtime.reason}")
        for key in runtime.drain_queue():
            self.finish_error(runtime, key, error, "OTHER", now)

    # ------------------------------------------------------------------ shutdown

    def begin_shutdown(self) -> None:
        """Refuse new work, fail what is queued, ask every worker to finalize and exit."""
        if self.stopping:
            return
        self.stopping = self.frontends.stopping = self.intake.stopping = True
        self.wake_by = None  # called between passes: the next one settles first
        self.lifecycle.shutdown()
        stop_everything(self.models.runtimes(), self.workers, self.finish_error,
                        time.monotonic())
        self.snapshot_dirty = True

    def workers_alive(self) -> bool:
        return bool(self.workers.entries)

    def kill_remaining(self) -> None:
        for identity in kill_unfinished(self.workers):
            self.on_worker_exit(identity)

    def close(self) -> None:
        for runtime in self.models.runtimes():
            runtime.scheduling.close()
        self.lifecycle.close()
        self.frontends.close()
        self.workers.close()

