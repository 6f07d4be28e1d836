"""The sequence batcher as the broker loop uses it: the pure batcher (schedulers/sequence) plus
what turns its executions into Batch messages (rows, inline control tensors, state bindings).

A sequence model's instances are numbered in ``ModelVersionRuntime.instances`` order; the batcher
pins each sequence to one of them. It is the ``RuntimeScheduling`` of a sequence model
(``schedulers/scheduling.py``): ``submit``, ``work_for(instance)`` when that instance's worker is
idle, ``done(batch_id, written)`` when its BatchResult arrives, ``expire`` on each tick,
``deadline`` for its sleep, ``cancel``, ``fail_instance`` when a worker dies, ``drain`` at
unload and ``close`` at exit.

Implicit state (``state [...]``) lives in a broker-owned SequenceStateStore, so a worker death
loses no state: the sequences of that instance keep their slots and continue on the restarted
worker (the request that was running fails and leaves its state as it was). Models without
implicit state keep whatever state they have inside the worker, so their sequences end with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shoal.broker.schedulers.base import QueuedRequest, Rejection, RequestKey
from shoal.broker.schedulers.scheduling import Work, WrittenStates
from shoal.broker.schedulers.sequence import (
    SequenceBatch,
    SequenceBatcher,
    SequenceBatcherConfig,
    SequenceConflict,
    SequenceReleased,
    SequenceRequest,
    create_sequence_batcher,
)
from shoal.broker.state_store import SequenceStateStore
from shoal.dtypes import numpy_to_wire
from shoal.errors import ShoalError
from shoal.messages import InferRequest, InlineTensor, StateBinding
from shoal.shm.tensors import array_to_bytes

logger = logging.getLogger(__name__)

StateStoreFactory = Callable[[SequenceBatcherConfig], SequenceStateStore]


class SequenceScheduling:
    per_instance = True  # sequences are pinned to instances
    def __init__(self, model_config: object, instance_count: int,
                 state_store: StateStoreFactory | None = None) -> None:
        self.config = SequenceBatcherConfig.from_model_config(model_config)  # type: ignore[arg-type]
        self.states: SequenceStateStore | None = None
        if self.config.states:
            if state_store is None:
                raise ValueError("a model with implicit state needs a state store")
            self.states = state_store(self.config)
        self._outputs = tuple(spec.output_name for spec in self.config.states)
        self.batcher: SequenceBatcher = create_sequence_batcher(self.config, instance_count)
        self._in_flight: dict[int, SequenceBatch] = {}  # batch id -> execution

    def submit(self, key: RequestKey, request: InferRequest, queued: QueuedRequest,
               now: float) -> Rejection | None:
        return self.batcher.submit(SequenceRequest(
            key=key, batch_size=request.batch_size, arrival=now, priority=request.priority,
            timeout_us=request.timeout_us, shape_signature=queued.shape_signature,
            correlation_id=request.correlation_id, flags=request.flags), now)

    def has_work(self, instance: int, now: float) -> bool:
        """Whether ``work_for(instance, ...)`` would give work now (the rate limiter stages an
        instance only then); nothing is taken."""
        return self.batcher.has_batch(instance, now)

    def work_for(self, instance: int, batch_id: int, now: float) -> Work | None:
        batch = self.batcher.next_batch(instance, now)
        if batch is None:
            return None
        self._in_flight[batch_id] = batch
        keys: list[RequestKey] = []
        rows: list[int] = []
        for row in batch.rows:
            if row.request is None:
                rows.append(-1)
            else:
                rows.append(len(keys))
                keys.append(row.request.key)
        tensors = batch.control_tensors(self.config.controls, self.config.max_batch_size > 0)
        controls = [InlineTensor(name, numpy_to_wire(array.dtype), list(array.shape),
                                 array_to_bytes(array, numpy_to_wire(array.dtype)))
                    for name, array in tensors.items()]
        states: dict[RequestKey, list[StateBinding]] = {}
        if self.states is not None:
            bound: list[int] = []
            try:
                for row in batch.rows:
                    if row.request is not None and row.state is not None:
                        states[row.request.key] = self.states.bindings(row.state)
                        bound.append(row.state.serial)
            except ShoalError as exc:  # no shm for a new sequence's state: nothing runs
                logger.warning("model %s: %s", self.config.model_name, exc.message)
                self.states.finish(bound)
                self._in_flight.pop(batch_id)
                self.batcher.on_batch_done(batch, now, {s: set(self._outputs) for s in bound})
                for serial in batch.released_states:
                    self.states.release(serial)
                return Work(keys, rows, controls, {}, exc)
        return Work(keys, rows, controls, states)

    def reschedule(self, instance: int, requests: list[QueuedRequest]) -> list[RequestKey]:
        return [q.key for q in requests]  # only iterative sequences reschedule

    def done(self, batch_id: int, now: float, written: WrittenStates) -> None:
        """The execution ``batch_id`` ended; ``written()``: the output states each request
        wrote (a request that failed or wrote none is absent), asked only with implicit
        state."""
        batch = self._in_flight.pop(batch_id, None)
        if batch is None:
            return
        unwritten: dict[int, set[str]] = {}
        if self.states is not None:
            outputs = set(self._outputs)
            wrote = written()
            for row in batch.rows:
                if row.request is None or row.state is None:
                    continue
                states = wrote.get(row.request.key, ())
                self.states.written(row.state.serial, states)
                unwritten[row.state.serial] = outputs - {s.output_name for s in states}
        self.batcher.on_batch_done(batch, now, unwritten)
        self._finish_states(batch)

    def _finish_states(self, batch: SequenceBatch) -> None:
        if self.states is None:
            return
        self.states.finish(self._row_serials(batch))
        for serial in batch.released_states:
            self.states.release(serial)

    @staticmethod
    def _row_serials(batch: SequenceBatch) -> list[int]:
        return [row.state.serial for row in batch.rows
                if row.request is not None and row.state is not None]

    def expire(self, now: float) -> list[Rejection]:
        rejections: list[Rejection] = []
        for notice in self.batcher.expire(now):
            if isinstance(notice, Rejection):
                rejections.append(notice)
            elif isinstance(notice, SequenceConflict):
                logger.warning("%s", notice.message)
            elif isinstance(notice, SequenceReleased):
                logger.debug("sequence %s released (%s)", notice.correlation_id, notice.reason)
                if self.states is not None and notice.state_serial is not None:
                    self.states.release(notice.state_serial)
        return rejections

    def deadline(self, now: float) -> float | None:
        return self.batcher.next_deadline(now)

    def cancel(self, key: RequestKey, now: float) -> list[RequestKey]:
        return [r.key for r in self.batcher.cancel(key, now)]

    def fail_instance(self, instance: int, batch_id: int | None, now: float) -> list[RequestKey]:
        """The worker of ``instance`` died while running ``batch_id`` (None: idle). Returns the
        queued requests that end with it. With implicit state nothing queued ends: the running
        execution counts as done with no state written, and the sequences continue on the
        restarted worker."""
        if self.states is not None:
            if batch_id is not None:
                self.done(batch_id, now, dict)
            return []
        if batch_id is not None:
            self._in_flight.pop(batch_id, None)
        return [r.key for r in self.batcher.fail_instance(instance, now)]

    def drain(self) -> list[RequestKey]:
        drained = [r.key for r in self.batcher.drain()]
        if self.states is not None:
            self.states.release_all()
        return drained

    def close(self) -> None:
        """Broker exit: unlink the state memory."""
        if self.states is not None:
            self.states.close()
