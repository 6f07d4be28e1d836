"""Triton's sequence batcher (core ``src/sequence_batch_scheduler/``) as pure state machines over
an injected clock: no sockets, threads, sleeps or logging. The broker does all I/O.

Unlike the other schedulers, a sequence batcher schedules *per instance* (sequences are pinned
to an instance, whose worker holds their implicit state) and must hear when an execution ends.

How the broker drives one (``now``: the broker's monotonic clock, seconds)::

    on load:       config = SequenceBatcherConfig.from_model_config(model_config)
                   batcher = create_sequence_batcher(config, instance_count)
    on a request:  rejection = batcher.submit(SequenceRequest(..., correlation_id=, flags=), now)
                   # not None: reply with it (INVALID_ARG: the request never entered)
    on a cancel:   for request in batcher.cancel(key, now): reply CANCELLED
    on wake-up:    for notice in batcher.expire(now):
                       Rejection         -> reply with it (backlog timeout: UNAVAILABLE)
                       SequenceReleased  -> if notice.state_serial is not None: tell the worker of
                                            notice.instance to free that state
                       SequenceConflict  -> log notice.message as a warning
                   for each idle instance i, while (batch := batcher.next_batch(i, now)):
                       dispatch batch to instance i (one execution at a time per instance)
    on completion: batcher.on_batch_done(batch, now, unwritten_states)   # success or error,
                   # every dispatched batch, before asking that instance for its next one
    worker death:  for request in batcher.fail_instance(i, now): reply with an error
                   # (its dispatched batches are failed by the broker; no on_batch_done)
    on unload:     for request in batcher.drain(): reply UNAVAILABLE
    then sleep until batcher.next_deadline(now)  (None: until the next message)

What the worker needs from a ``SequenceBatch``: for each row in order, the request (or, for a
not-ready row, zero inputs shaped like ``batch.filler``'s); the control tensors
``batch.control_tensors(config.controls, config.batching)`` added as inputs; each row's
``StateAssignment`` (see ``state``); and ``batch.released_states`` to free afterwards.
Messages to one worker must keep their order (a state freed by a notice may still be used by an
execution sent before it).

Ownership: a request belongs to the batcher from a ``submit`` that returned None until it leaves
through ``next_batch``, ``expire`` (a Rejection), ``cancel``, ``fail_instance`` or ``drain``.

Sequence rules (Triton's, with its messages): a request needs a non-zero / non-empty correlation id
(a string one, at most 128 bytes, fits a CORRID control of any type; an integer one does not fit a
string CORRID) and batch size 1; a request without START on an id with no live sequence is rejected
("must specify the START flag"); END closes the sequence when it is submitted. A START on a live id
is Triton's conflict: the earlier sequence ends (its queued requests still run first, then the new
START re-initializes the state in the same slot) and a SequenceConflict notice carries the warning.
A sequence with nothing queued or running for ``max_sequence_idle_microseconds`` is released (its
slot goes to the backlog; a later request on it needs START). The ``timeout`` of a request applies
only while its sequence waits in the backlog: the whole backlogged sequence is then rejected
("timeout of the corresponding sequence has been expired"), and the id forgotten.

Deliberate differences from Triton, each for a client that behaves: idle time counts from the
later of the last arrival and the last completion, and restarts when a backlogged sequence gets
its slot (Triton counts from arrival only, so a sequence that waited long in the backlog or ran a
long execution is reaped right away); cancelling any queued request ends its sequence at once
(Triton: when it reaches the front of its slot; an issued oldest-strategy request only fails
itself); a worker death ends the sequences of that instance; the oldest strategy gives a new
sequence a free slot with nothing in flight when there is one.
"""

from __future__ import annotations

from shoal.broker.schedulers.sequence.batch import (
    BatchRow,
    Notice,
    SequenceBatch,
    SequenceConflict,
    SequenceReleased,
)
from shoal.broker.schedulers.sequence.controls import RowControl, build_control_tensors
from shoal.broker.schedulers.sequence.direct import DirectSequenceBatcher
from shoal.broker.schedulers.sequence.oldest import OldestSequenceBatcher
from shoal.broker.schedulers.sequence.requests import (
    SEQUENCE_END,
    SEQUENCE_START,
    CorrelationId,
    SequenceRequest,
)
from shoal.broker.schedulers.sequence.state import StateAssignment, StateBuffers
from shoal.config.sequence_batching import (
    BoolControl,
    ControlInputs,
    CorridControl,
    InitialStateSpec,
    SequenceBatcherConfig,
    StateSpec,
)

SequenceBatcher = DirectSequenceBatcher | OldestSequenceBatcher


def create_sequence_batcher(config: SequenceBatcherConfig, instance_count: int) -> SequenceBatcher:
    """The batcher of ``config.strategy`` for ``instance_count`` instances (numbered from 0)."""
    if config.strategy == "oldest":
        return OldestSequenceBatcher(config, instance_count)
    return DirectSequenceBatcher(config, instance_count)


__all__ = [
    "SEQUENCE_END",
    "SEQUENCE_START",
    "BatchRow",
    "BoolControl",
    "ControlInputs",
    "CorrelationId",
    "CorridControl",
    "DirectSequenceBatcher",
    "InitialStateSpec",
    "Notice",
    "OldestSequenceBatcher",
    "RowControl",
    "SequenceBatch",
    "SequenceBatcher",
    "SequenceBatcherConfig",
    "SequenceConflict",
    "SequenceReleased",
    "SequenceRequest",
    "StateAssignment",
    "StateBuffers",
    "StateSpec",
    "build_control_tensors",
    "create_sequence_batcher",
]
