"""The worker process: one model instance on one device (docs/architecture.md §1).

Loop: receive a Batch from the broker (first freeing the output leases it carries: releases
given back while this worker was busy ride on its next Batch), map each request's inputs from
shared memory (no copy), run the backend, copy outputs into this worker's output arena (or a
client's region), answer with a BatchResult. It knows nothing about HTTP or scheduling.
Entry: ``python -m shoal.workers <WorkerSpec JSON>``.

``WorkerProc`` orchestrates; its collaborators each do one part: ``batch_requests.BatchRequests``
maps a batch's inputs into backend requests, ``outputs.OutputWriter`` writes the answers,
``streaming.DecoupledStreams`` sends a decoupled model's responses.

Sockets (all DEALERs to the broker's worker ROUTER):
  ``<identity>``    batches in, BatchResults out; the main thread only.
  ``<identity>#s``  StreamResponses of decoupled models (``DecoupledStreams``), sent by whatever
                    thread the model answers from, serialized by ``output_lock`` (which also
                    guards the arena).
  ``<identity>#c``  CancelExecuting, ForgetCudaHandles and LogLevel in; read by the control
                    thread, which only sets flags, queues forgets (applied between batches) and
                    sets the root logger's level.

Lifecycle: load -> WorkerReady (or WorkerLoadFailed and exit 1); WorkerShutdown or STOP_SIGNAL
-> finalize the model, unlink own segments, exit 0. The parent's (the broker's) death, which
the kernel announces with STOP_SIGNAL, leaves nobody to answer to: the worker stops at once,
abandoning a load or an execute in progress (SystemExit raised in the main thread; the model is
still finalized and the segments unlinked), exit 1.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType

import msgspec
import zmq

from shoal.config.model_config import config_from_json, is_decoupled
from shoal.errors import ErrorCode, ShoalError
from shoal.messages import (
    Batch,
    BatchResult,
    BatchTimings,
    CancelExecuting,
    CollectCustomMetrics,
    CustomMetricsSnapshot,
    Error,
    ForgetCudaHandles,
    Heartbeat,
    Lease,
    LogLevel,
    ReleaseLeases,
    Result,
    WorkerLoadFailed,
    WorkerReady,
    WorkerRequest,
    WorkerShutdown,
    WorkerSpec,
    WrittenState,
    decode,
    encode,
)
from shoal.messages.worker import HEARTBEAT_INTERVAL_S
from shoal.process.devices import resolve_device
from shoal.process.lifecycle import (
    STOP_SIGNAL,
    die_with_parent,
    hold_instance_lock,
    ignore_group_signals,
    parent_died,
    setup_logging,
)
from shoal.settings import WorkerSettings
from shoal.shm.arena import Arena
from shoal.shm.client_regions import ClientRegions
from shoal.shm.regions import RegionCache
from shoal.workers.backends.base import (
    Answer,
    Backend,
    BackendResponse,
    InstanceContext,
    Rescheduled,
    llm_stats,
)
from shoal.workers.backends.registry import create_backend
from shoal.workers.batch_requests import BatchRequests
from shoal.workers.bls.client import BlsClient
from shoal.workers.custom_metrics import REGISTRY as CUSTOM_METRICS
from shoal.workers.device_regions import DeviceRegions, LazyCudaIpc
from shoal.workers.output_lending import OutputLender
from shoal.workers.outputs import OutputWriter, error_of
from shoal.workers.sequence_state import ViewOf, write_output_states
from shoal.workers.streaming import DecoupledStreams
from shoal.workers.warmup import WarmupResponseSink, build_samples, run_warmup

logger = logging.getLogger(__name__)

_POLL_MS = 200
_CLIENT_SWEEP_S = 1.0  # how often, between batches, mappings of removed client objects close


class WorkerProc:
    def __init__(self, spec: WorkerSpec, settings: WorkerSettings) -> None:
        self.spec = spec
        self.settings = settings
        self.stopping = False
        self.closing = False  # close() began: a stop signal no longer interrupts anything
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.socket = self._connect("")
        self.stream_socket = self._connect("#s")
        self.control_socket = self._connect("#c")
        self.segment_prefix = settings.instance.segment_prefix  # a property that formats a string
        self.inputs = RegionCache(self.segment_prefix)
        self.client_regions = ClientRegions(
            allow_foreign_owner=settings.client_shm.allow_foreign_owner)
        self.arena = Arena(spec.arena_prefix, settings.shm.segment_bytes,
                           settings.shm.arena_max_bytes)
        self.device_regions = DeviceRegions(LazyCudaIpc())  # libcuda only at the first CUDA ref
        self.lender = OutputLender(self.arena)  # open only while a batch runs (see execute)
        self.outputs = OutputWriter(spec.identity, self.arena, self.client_regions,
                                    self.device_regions, self.lender)
        self.output_lock = threading.Lock()
        self.bls = BlsClient(spec, settings, self.context)  # connects at the first BLS call
        self.cancelled: set[int] = set()
        self.streams = DecoupledStreams(self.stream_socket, self.output_lock, self.outputs,
                                        self.device_regions, self.cancelled)
        self.requests: BatchRequests | None = None  # built by load, for the loaded backend
        self.backend: Backend | None = None
        self.decoupled = False
        self.device = "cpu"
        self.control_thread = threading.Thread(target=self._control_loop, name="control",
                                               daemon=True)

    def _connect(self, suffix: str) -> zmq.Socket[bytes]:
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, (self.spec.identity + suffix).encode())
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(self.spec.broker_endpoint)
        return sock

    def load(self) -> None:
        config = config_from_json(self.spec.config_json)
        self.decoupled = is_decoupled(config)
        self.device = device = resolve_device(self.spec.kind, self.spec.device_id)
        responses = WarmupResponseSink(self.streams.send_response)  # keeps warmup answers in here
        backend_settings = {k: v for b, k, v in self.settings.backend.config
                            if b in ("", self.spec.backend)}
        ctx = InstanceContext(
            model_name=self.spec.model_name, model_version=self.spec.model_version,
            model_dir=self.spec.model_dir, version_dir=self.spec.version_dir, config=config,
            config_json=self.spec.config_json, instance_name=self.spec.instance_name,
            kind=self.spec.kind, device=device, device_id=self.spec.device_id,
            backend_settings=backend_settings, send_response=responses,
            stream_batch=self.streams.stream_batch,
            is_cancelled=self.cancelled.__contains__, bls=self.bls,
            lend_output=None if self.decoupled else self._lend_output,
            default_intra_op_threads=self.spec.intra_op_threads,
            shm_free_bytes=lambda: self.arena.max_bytes - self.arena.used_bytes,
        )
        backend = create_backend(self.spec.backend, self.spec.model_dir, self.spec.version_dir,
                                 self.settings.backend.directory)
        backend.load(ctx)
        self.backend = backend
        self.requests = BatchRequests(
            backend, device, self.segment_prefix, self.inputs, self.client_regions,
            self.device_regions, self.streams.open if self.decoupled else None)
        run_warmup(backend, build_samples(config, self.spec.model_dir), responses,
                   decoupled=self.decoupled)  # before WorkerReady: not READY until warmed up

    def _lend_output(self, nbytes: int) -> memoryview | None:
        """InstanceContext.lend_output (main thread, inside ``backend.execute``)."""
        with self.output_lock:
            return self.lender.lend(nbytes)

    def serve(self) -> None:
        self.socket.send_multipart(encode(WorkerReady(self.spec.identity, os.getpid())))
        next_sweep = 0.0
        while not self.stopping:
            self.device_regions.between_batches()  # no execute runs here
            if self.client_regions and time.monotonic() >= next_sweep:
                self.client_regions.drop_unlinked()  # objects their clients removed
                next_sweep = time.monotonic() + _CLIENT_SWEEP_S
            if not self.socket.poll(_POLL_MS):
                continue
            message = decode(self.socket.recv_multipart())
            if isinstance(message, Batch):
                if message.releases:  # given back while this worker was busy: free them first
                    self._release(message.releases)
                result = self.execute(message)
                self.socket.send_multipart(encode(result))
            elif isinstance(message, ReleaseLeases):
                self._release(message.leases)
            elif isinstance(message, WorkerShutdown):
                self.stopping = True

    def _release(self, leases: list[Lease]) -> None:
        """Main thread, between batches: the holders are done with these output leases."""
        with self.output_lock:
            for lease in leases:
                self.outputs.release(lease.lease_id)

    def _control_loop(self) -> None:
        """Cancellation flags and forgets arrive here while the main thread may be inside the
        model; heartbeats leave from here (from the start of the load on), so a stopped or
        wedged process falls silent while a long execute does not. A heartbeat carries the
        model's custom metrics when they changed, and an llm backend's executor figures."""
        next_beat = 0.0
        while not self.stopping:
            if time.monotonic() >= next_beat:
                self.control_socket.send_multipart(encode(Heartbeat(
                    os.getpid(), CUSTOM_METRICS.changed_since_last(), llm_stats(self.backend))))
                next_beat = time.monotonic() + HEARTBEAT_INTERVAL_S
            if not self.control_socket.poll(_POLL_MS):
                continue
            message = decode(self.control_socket.recv_multipart())
            if isinstance(message, CancelExecuting):
                self.cancelled.update(message.request_ids)
            elif isinstance(message, ForgetCudaHandles):
                self.device_regions.queue_forget(message.handles)
            elif isinstance(message, LogLevel):  # the logging API, server-wide
                logging.getLogger().setLevel(message.level)
            elif isinstance(message, CollectCustomMetrics):  # a /metrics scrape, while it runs
                self.control_socket.send_multipart(encode(CustomMetricsSnapshot(
                    message.token, CUSTOM_METRICS.snapshot())))

    # ------------------------------------------------------------------ execution

    def execute(self, batch: Batch) -> BatchResult:
        assert self.backend is not None and self.requests is not None
        # CLOCK_MONOTONIC, the clock of every process: t0 also stamps traced requests
        t0 = time.monotonic_ns()
        requests, errors = self.requests.build(batch)
        t1 = time.monotonic_ns()
        if not self.decoupled:
            with self.output_lock:
                self.lender.open()  # closed once the answers are written, below
        try:
            responses = list(self.backend.execute(requests)) if requests else []
            if len(responses) != len(requests):
                raise ShoalError(ErrorCode.INTERNAL, "backend returned the wrong number of "
                                 f"responses: {len(responses)} for {len(requests)} requests")
        except Exception as exc:
            logger.exception("model %s instance %s failed to execute a batch",
                             self.spec.model_name, self.spec.instance_name)
            responses = [error_of(exc)] * len(requests)
        t2 = time.monotonic_ns()
        timings = BatchTimings(t1 - t0, t2 - t1, 0, t0)
        if batch.rows:  # drop the answers of not-ready rows (negative ids)
            kept = [(r, a) for r, a in zip(requests, responses, strict=True) if r.request_id >= 0]
            requests, responses = [r for r, _ in kept], [a for _, a in kept]
        if self.decoupled:
            return self.streams.finish_batch(batch, requests, responses, errors, timings)
        by_id = {r.request_id: resp for r, resp in zip(requests, responses, strict=True)}
        states = self._write_states(batch, by_id, self.requests.state_view) if batch.rows else {}
        answered: list[WorkerRequest] = []  # every request but the rescheduled ones
        ordered: list[BackendResponse | Error] = []
        rescheduled: list[int] = []
        for r in batch.requests:
            answer = by_id.get(r.request_id) or errors.get(r.request_id)
            if isinstance(answer, Rescheduled):
                rescheduled.append(r.request_id)
                continue
            answered.append(r)
            ordered.append(answer if answer is not None else Error(
                ErrorCode.INTERNAL, "model returned no response for the request"))
        with self.output_lock:
            try:
                results, lease = self.outputs.write_results(
                    [r.request_id for r in answered], [r.outputs for r in answered], ordered)
                self.device_regions.synchronize()  # the client may read the moment it knows
            except Exception as exc:  # a request the model answered executed (in_response)
                results = [Result(r.request_id, error=error_of(
                    exc, in_response=isinstance(answer, BackendResponse)))
                    for r, answer in zip(answered, ordered, strict=True)]
                lease = None
            finally:
                self.lender.close()  # frees the lent slots no answer references
        if states:
            results = [msgspec.structs.replace(r, states=states[r.request_id])
                       if r.error is None and r.request_id in states else r for r in results]
        t3 = time.monotonic_ns()
        self.cancelled.difference_update(r.request_id for r in answered)  # flags outlive a
        return BatchResult(batch.batch_id, results,                     # rescheduling
                           BatchTimings(t1 - t0, t2 - t1, t3 - t2, t0), lease, rescheduled)

    @staticmethod
    def _write_states(batch: Batch, answers: dict[int, Answer], state_view: ViewOf
                      ) -> dict[int, list[WrittenState]]:
        """Copy out the output states of the requests that have implicit state (replacing their
        answer by the response without them, or by an error); returns what each wrote."""
        written: dict[int, list[WrittenState]] = {}
        for req in batch.requests:
            answer = answers.get(req.request_id)
            if not req.states or not isinstance(answer, BackendResponse):
                continue
            outcome = write_output_states(req, answer, state_view)
            if isinstance(outcome, Error):
                answers[req.request_id] = outcome
            else:
                answers[req.request_id], written[req.request_id] = outcome
        return written

    def close(self) -> None:
        self.stopping = self.closing = True
        if self.backend is not None:
            try:
                self.backend.unload()
            except Exception:
                logger.exception("finalize of %s failed", self.spec.instance_name)
            self.backend = None
        self.bls.close()  # after finalize: the model's last BLS views are gone, releases sent
        if self.control_thread.is_alive():
            self.control_thread.join(timeout=1.0)
        with self.output_lock:
            self.arena.close()
            self.inputs.close()
            self.client_regions.close()
            self.device_regions.close()
        for sock in (self.socket, self.stream_socket, self.control_socket):
            sock.close(linger=500)


def run_worker(spec: WorkerSpec, settings: WorkerSettings, parent: int | None = None) -> int:
    """``parent``: the broker's pid (``die_with_parent``); None: its death is not told apart
    from a plain STOP_SIGNAL."""
    proc = WorkerProc(spec, settings)

    def on_stop(signum: int, frame: FrameType | None) -> None:
        proc.stopping = True
        if parent is not None and parent_died(parent) and not proc.closing:
            proc.closing = True  # once: the finalize below is not interrupted
            logger.warning("the broker died: model %s instance %s stops now, abandoning its "
                           "work", spec.model_name, spec.instance_name)
            raise SystemExit(1)

    ignore_group_signals()
    signal.signal(STOP_SIGNAL, on_stop)
    proc.control_thread.start()  # heartbeats during the load too
    try:
        try:
            proc.load()
        except Exception as exc:
            message = exc.message if isinstance(exc, ShoalError) else f"{type(exc).__name__}: {exc}"
            logger.error("failed to load model %s instance %s: %s", spec.model_name,
                         spec.instance_name, message)
            proc.socket.send_multipart(encode(WorkerLoadFailed(spec.identity, message)))
            return 1
        gc.collect()
        gc.freeze()  # the loaded model never dies: keep it out of every later collection
        proc.serve()
        return 0
    finally:
        proc.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    spec = msgspec.json.decode(args[0], type=WorkerSpec)
    settings = spec.settings
    setup_logging(settings, f"worker {spec.instance_name}")
    if spec.log_level:  # the logging API's change before this spawn
        logging.getLogger().setLevel(spec.log_level)
    hold_instance_lock(settings)  # before any segment: a sweep must see this instance live
    parent = die_with_parent(STOP_SIGNAL)
    return run_worker(spec, settings, parent)
