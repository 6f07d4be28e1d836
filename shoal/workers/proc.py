"""The worker process: one model instance on one device (docs/architecture.md §1).

Loop: receive a Batch from the broker (first freeing the output leases it carries: releases
given back while this worker was busy ride on its next Batch), map each request's inputs from
shared memory (no copy), run the backend, copy outputs into this worker's output arena (or a
client's region), answer with a BatchResult. It knows nothing about HTTP or scheduling.
Entry: ``python -m shoal.workers <WorkerSpec JSON>``.

Sockets (all DEALERs to the broker's worker ROUTER):
  ``<identity>``    batches in, BatchResults out; the main thread only.
  ``<identity>#s``  StreamResponses of decoupled models, sent by whatever thread the model
                    answers from, serialized by ``output_lock`` (which also guards the arena).
  ``<identity>#c``  CancelExecuting, ForgetCudaHandles and LogLevel in; read by the control
                    thread, which only sets flags, queues forgets (applied between batches) and
                    sets the root logger's level.

Lifecycle: load -> WorkerReady (or WorkerLoadFailed and exit 1); WorkerShutdown, STOP_SIGNAL or
the parent's death -> finalize the model, unlink own segments, exit 0.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import msgspec
import zmq

from shoal.config.model_config import config_from_json, is_decoupled
from shoal.dtypes import numpy_to_wire
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
    StreamResponse,
    StreamResponses,
    TensorRef,
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
    setup_logging,
)
from shoal.settings import Settings
from shoal.shm.arena import Arena
from shoal.shm.client_regions import ClientRegions
from shoal.shm.regions import RegionCache
from shoal.shm.tensors import array_from_buffer
from shoal.workers.backends.base import (
    Answer,
    Backend,
    BackendRequest,
    BackendResponse,
    InstanceContext,
    Rescheduled,
    llm_stats,
)
from shoal.workers.backends.registry import create_backend
from shoal.workers.bls.client import BlsClient
from shoal.workers.custom_metrics import REGISTRY as CUSTOM_METRICS
from shoal.workers.device_regions import DeviceRegions, LazyCudaIpc, zeros_like
from shoal.workers.output_lending import OutputLender
from shoal.workers.outputs import OutputWriter, error_of
from shoal.workers.sequence_state import (
    requested_with_states,
    state_inputs,
    write_output_states,
)
from shoal.workers.warmup import WarmupResponseSink, build_samples, run_warmup

logger = logging.getLogger(__name__)

_POLL_MS = 200
_CLIENT_SWEEP_S = 1.0  # how often, between batches, mappings of removed client objects close
_NONE: frozenset[str] = frozenset()


class WorkerProc:
    def __init__(self, spec: WorkerSpec, settings: Settings) -> None:
        self.spec = spec
        self.settings = settings
        self.stopping = False
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.socket = self._connect("")
        self.stream_socket = self._connect("#s")
        self.control_socket = self._connect("#c")
        self.segment_prefix = settings.segment_prefix  # a property that formats a string
        self.inputs = RegionCache(self.segment_prefix)
        self.client_regions = ClientRegions()
        self.arena = Arena(spec.arena_prefix, settings.shm_segment_bytes,
                           settings.shm_arena_max_bytes)
        self.device_regions = DeviceRegions(LazyCudaIpc())  # libcuda only at the first CUDA ref
        self.lender = OutputLender(self.arena)  # open only while a batch runs (see execute)
        self.outputs = OutputWriter(spec.identity, self.arena, self.client_regions,
                                    self.device_regions, self.lender)
        self.output_lock = threading.Lock()
        self._stream_held = threading.local()  # .messages: responses held by stream_batch
        self.bls = BlsClient(spec, settings, self.context)  # connects at the first BLS call
        # decoupled requests still answering: execution id -> the request (outputs wanted)
        self.open_requests: dict[int, WorkerRequest] = {}
        self.cancelled: set[int] = set()
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
        responses = WarmupResponseSink(self.send_response)  # keeps warmup answers in here
        backend_settings = {k: v for b, k, v in self.settings.backend_config
                            if b in ("", self.spec.backend)}
        ctx = InstanceContext(
            model_name=self.spec.model_name, model_version=self.spec.model_version,
            model_dir=self.spec.model_dir, version_dir=self.spec.version_dir, config=config,
            config_json=self.spec.config_json, instance_name=self.spec.instance_name,
            kind=self.spec.kind, device=device, device_id=self.spec.device_id,
            backend_settings=backend_settings, send_response=responses,
            stream_batch=self.stream_batch,
            is_cancelled=self.cancelled.__contains__, bls=self.bls,
            lend_output=None if self.decoupled else self._lend_output,
            default_intra_op_threads=self.spec.intra_op_threads,
            shm_free_bytes=lambda: self.arena.max_bytes - self.arena.used_bytes,
        )
        backend = create_backend(self.spec.backend, self.spec.model_dir, self.spec.version_dir,
                                 self.settings.backend_directory)
        backend.load(ctx)
        self.backend = backend
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

    def _map_inputs(self, req: WorkerRequest) -> dict[str, Any]:
        inputs = {ref.name: self._input_value(ref) for ref in req.inputs}
        if req.states:
            inputs.update(state_inputs(req, self._state_view))
        return inputs

    def _state_view(self, region: str, offset: int, nbytes: int) -> memoryview:
        return self.inputs.view(region, offset, nbytes, readonly=False)

    def _input_value(self, ref: TensorRef) -> Any:
        if ref.cuda is not None:
            return self.device_regions.input_value(ref, self.backend, self.device)
        if ref.inline is not None:  # an ensemble step's input from a small streamed answer
            view = memoryview(bytearray(ref.inline))
        elif ref.region.startswith(self.segment_prefix):
            view = self.inputs.view(ref.region, ref.offset, ref.nbytes, readonly=False)
        else:
            view = self.client_regions.view(ref.region, ref.offset, ref.nbytes, ref.name,
                                            object_id=ref.object_id)
        return array_from_buffer(view, ref.datatype, ref.shape)

    def execute(self, batch: Batch) -> BatchResult:
        assert self.backend is not None
        # CLOCK_MONOTONIC, the clock of every process: t0 also stamps traced requests
        t0 = time.monotonic_ns()
        requests, errors = (self._sequence_requests(batch) if batch.rows
                            else self._batch_requests(batch))
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
            return self._finish_decoupled(batch, requests, responses, errors, timings)
        by_id = {r.request_id: resp for r, resp in zip(requests, responses, strict=True)}
        states = self._write_states(batch, by_id) if batch.rows else {}
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

    def _write_states(self, batch: Batch, answers: dict[int, Answer]
                      ) -> dict[int, list[WrittenState]]:
        """Copy out the output states of the requests that have implicit state (replacing their
        answer by the response without them, or by an error); returns what each wrote."""
        written: dict[int, list[WrittenState]] = {}
        for req in batch.requests:
            answer = answers.get(req.request_id)
            if not req.states or not isinstance(answer, BackendResponse):
                continue
            outcome = write_output_states(req, answer, self._state_view)
            if isinstance(outcome, Error):
                answers[req.request_id] = outcome
            else:
                answers[req.request_id], written[req.request_id] = outcome
        return written

    def _backend_request(self, req: WorkerRequest, inputs: dict[str, Any]) -> BackendRequest:
        if self.decoupled:
            self.open_requests[req.request_id] = req
        on_device = [o.name for o in req.outputs
                     if o.target is not None and o.target.cuda is not None]
        return BackendRequest(
            request_id=req.request_id, inputs=inputs,
            input_datatypes=self._datatypes(req, inputs),
            requested_outputs=requested_with_states(req), parameters=req.parameters,
            client_request_id=req.client_request_id, batch_size=req.batch_size,
            correlation_id=req.correlation_id, flags=req.flags,
            device_outputs=frozenset(on_device) if on_device else _NONE)

    @staticmethod
    def _datatypes(req: WorkerRequest, inputs: dict[str, Any]) -> dict[str, str]:
        """Input name -> wire datatype, in ``inputs``' order: the declared one, else the
        array's (state inputs)."""
        declared = {ref.name: ref.datatype for ref in req.inputs}
        if len(declared) == len(inputs) and all(declared.values()):
            return declared  # the same names in the same order: inputs maps exactly req.inputs
        return {name: declared.get(name) or numpy_to_wire(array.dtype)
                for name, array in inputs.items()}

    def _batch_requests(self, batch: Batch) -> tuple[list[BackendRequest], dict[int, Error]]:
        requests: list[BackendRequest] = []
        errors: dict[int, Error] = {}
        for req in batch.requests:
            try:
                requests.append(self._backend_request(req, self._map_inputs(req)))
            except ShoalError as exc:
                errors[req.request_id] = Error(exc.code, exc.message)
        return requests, errors

    def _sequence_requests(self, batch: Batch) -> tuple[list[BackendRequest], dict[int, Error]]:
        """One backend request per batch row, in row order, each with its row of the control
        tensors; a not-ready row gets zeros shaped like the first request (negative id)."""
        controls = {c.name: (c.datatype, array_from_buffer(memoryview(c.data), c.datatype,
                                                           c.shape)) for c in batch.controls}
        errors: dict[int, Error] = {}
        mapped: dict[int, dict[str, Any]] = {}
        for req in batch.requests:
            try:
                mapped[req.request_id] = self._map_inputs(req)
            except ShoalError as exc:
                errors[req.request_id] = Error(exc.code, exc.message)
        filler_source = next(iter(mapped.values()), {})
        requests: list[BackendRequest] = []
        for row, index in enumerate(batch.rows):
            row_controls = {name: array[row:row + 1] for name, (_, array) in controls.items()}
            if index < 0:
                filler = WorkerRequest(request_id=-(row + 1), inputs=[])
                zeros = {n: zeros_like(a) for n, a in filler_source.items()}
                requests.append(self._backend_request(filler, {**zeros, **row_controls}))
                continue
            req = batch.requests[index]
            if req.request_id in mapped:
                requests.append(self._backend_request(
                    req, {**mapped[req.request_id], **row_controls}))
        return requests, errors

    def _finish_decoupled(self, batch: Batch, requests: list[BackendRequest],
                          responses: list[Answer],
                          errors: dict[int, Error], timings: BatchTimings) -> BatchResult:
        """execute() returned: the instance is free again; requests that got an error (or a
        direct response, which a decoupled model should not return) end now, the rest keep
        answering through send_response. The BatchResult lists only requests that ended."""
        ended: list[Result] = []
        for request_id, error in errors.items():
            ended.append(Result(request_id, error=error))
        rescheduled: list[int] = []  # their streams stay open; the broker runs them again
        for request, response in zip(requests, responses, strict=True):
            if isinstance(response, Rescheduled):
                rescheduled.append(request.request_id)
            elif response is not None and request.request_id in self.open_requests:
                self.send_response(request.request_id, response, True)
        # compute_output: from execute's return to here (the ended answers' work), as Triton
        # times the output phase after execute for a decoupled model too
        executed = timings.start_ns + timings.compute_input_ns + timings.compute_infer_ns
        timings = msgspec.structs.replace(timings, compute_output_ns=time.monotonic_ns()
                                          - executed)
        return BatchResult(batch.batch_id, ended, timings, rescheduled=rescheduled)

    def send_response(self, request_id: int, response: BackendResponse | Error | None,
                      final: bool) -> None:
        """InstanceContext.send_response: any thread, serialized by output_lock."""
        with self.output_lock:
            request = self.open_requests.get(request_id)
            if request is None:
                raise ShoalError(ErrorCode.INVALID_ARG,
                                 "the request has already been sent its final response")
            message = self._stream_message(request, response, final)
            if final:
                del self.open_requests[request_id]
                self.cancelled.discard(request_id)
            held: list[StreamResponse] | None = getattr(self._stream_held, "messages", None)
            if held is not None:
                held.append(message)
            else:
                self.stream_socket.send_multipart(encode(message))

    @contextmanager
    def stream_batch(self) -> Iterator[None]:
        """InstanceContext.stream_batch: this thread's responses inside the block leave as one
        StreamResponses message at its end (one send and one broker turn instead of many)."""
        if getattr(self._stream_held, "messages", None) is not None:  # nested: the outer sends
            yield
            return
        held: list[StreamResponse] = []
        self._stream_held.messages = held
        try:
            yield
        finally:
            self._stream_held.messages = None
            if held:
                with self.output_lock:
                    self.stream_socket.send_multipart(encode(
                        held[0] if len(held) == 1 else StreamResponses(held)))

    def _stream_message(self, request: WorkerRequest, response: BackendResponse | Error | None,
                        final: bool) -> StreamResponse:
        rid = request.request_id
        if response is None:
            return StreamResponse(rid, final=final, empty=True)
        if isinstance(response, Error):
            return StreamResponse(rid, error=response, final=final)
        try:
            refs, parameters, lease = self.outputs.write_one(request.outputs, response)
            self.device_regions.synchronize()
        except Exception as exc:  # the model answered; its outputs could not be delivered
            return StreamResponse(rid, error=error_of(exc, in_response=True), final=final)
        return StreamResponse(rid, refs, parameters, None, lease, final)

    def close(self) -> None:
        self.stopping = True
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


def run_worker(spec: WorkerSpec, settings: Settings) -> int:
    proc = WorkerProc(spec, settings)

    def on_stop(signum: int, frame: FrameType | None) -> None:
        proc.stopping = True

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
    settings = Settings.from_json(spec.settings_json)
    setup_logging(settings, f"worker {spec.instance_name}")
    hold_instance_lock(settings)  # before any segment: a sweep must see this instance live
    die_with_parent(STOP_SIGNAL)
    return run_worker(spec, settings)
