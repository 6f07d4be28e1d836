"""One ensemble request as a pure state machine (docs/architecture.md §5): which composing-model
calls can run now, what each call's inputs are, and when the request ends and with what.

How the broker drives a run:

    run = EnsembleRun(plan, {ref.name: ref for ref in request.inputs},
                      batch_size=request.batch_size, requested_outputs=request.outputs)
    on every change:   for call in run.ready_steps(): submit step_request(call, request, id)
                       to the composing model's own scheduler (it batches as usual)
    on a step answer:  run.on_step_done(call.step, {ref.name: ref for ref in outputs} | error,
                                        lease)
                       release run.releasable_leases() to their workers
    when run.finished(): answer the client with run.result() (+ run.result_leases())
    a call never issued (it waited for a slot, ``admission``, and the run failed meanwhile):
                       run.withdraw(call.step)

Steps start as soon as all their inputs exist, so independent branches run in parallel. The
first failing step fails the run: no further step is issued, the steps already running are
waited for, and the error names the step: ``in ensemble 'e', step 2 (model 'm'): <message>``.
Steps that no requested output depends on are never issued (Triton prunes them too).

Ownership of tensor memory (tensors never leave shared memory; the broker moves descriptors):

- Ensemble inputs (the request's TensorRefs) belong to the frontend (its arena slots or a
  client's registered region) until it receives the ensemble's InferResponse. The run feeds
  them to steps but never lists them as held or releasable. ``finished()`` is true only when no
  step is in flight, so no worker still reads them when the frontend frees them.
- Intermediate tensors are outputs of composing models: slices of a worker's output arena
  under the lease of that step's response (``BatchResult.lease``; one lease per response,
  released exactly once). The broker hands the lease to ``on_step_done``; the run then keeps
  it on the broker's behalf. A tensor is held while a step that reads it has not completed
  (issued and still running, or not yet issued while the run can still succeed), or while it
  is a requested ensemble output of a run that can still succeed. Once none of a response's
  tensors is held, its lease appears in ``releasable_leases()``: the broker sends it back to
  the worker (``ReleaseLeases``). Outputs that arrive after the run failed are releasable at
  once, and so is an output no one needs.
- Ensemble outputs: when the run succeeds, the leases of the responses that back the result
  move to ``result_leases()``; the broker gives them to the frontend with the response, and
  the frontend releases them as it does any response's lease.

Not thread-safe: the broker loop alone calls it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from shoal.broker.ensemble.plan import EnsemblePlan, EnsembleStep
from shoal.broker.ensemble.shapes import adapt_shape
from shoal.broker.ensemble.step_inputs import check_step_inputs
from shoal.errors import ErrorCode
from shoal.messages import Error, InferRequest, Lease, RequestedOutput, TensorRef

StepOutcome = Mapping[str, TensorRef] | Error
"""What a step returned: its outputs by composing output name, or its error."""


@dataclass(frozen=True, slots=True)
class StepCall:
    """One composing-model request to issue. ``inputs``: composing input name -> tensor (named
    and shaped for that model). ``outputs``: the composing outputs the run needs (with the
    client's shared-memory target when the ensemble output they become asked for one).
    ``model_version`` -1 means the composing model's latest ready version."""

    step: int
    model_name: str
    model_version: int
    inputs: dict[str, TensorRef]
    outputs: list[RequestedOutput]
    batch_size: int  # the leading dim for a batching model, else 1 (as InferRequest)


@dataclass(frozen=True, slots=True)
class _Value:
    """An ensemble tensor's content in this run; ``ref`` None: absent (``absent`` says why)."""

    ref: TensorRef | None
    batch_size: int  # Triton's: 0 when made by (or for) a non-batching model
    absent: str = ""


@dataclass(slots=True)
class _Response:
    """The outputs one step returned, each with the ensemble tensor it became (None: not
    needed), and the lease over their memory."""

    lease: Lease | None
    refs: list[tuple[str | None, TensorRef]]
    released: set[int] = field(default_factory=set)  # positions in ``refs``


class EnsembleRun:
    """The state of one ensemble request. ``inputs``: ensemble input name -> tensor;
    ``batch_size``: the request's (leading dim when the ensemble batches, else 1);
    ``requested_outputs``: the request's outputs (empty: every ensemble output). A request
    that does not fit the ensemble makes a run that is finished at once, with the error."""

    def __init__(self, plan: EnsemblePlan, inputs: Mapping[str, TensorRef], *,
                 batch_size: int = 1, requested_outputs: Sequence[RequestedOutput] = ()) -> None:
        self._plan = plan
        self._requested = {o.name: o for o in requested_outputs} or {
            name: RequestedOutput(name) for name in plan.outputs}
        self._values: dict[str, _Value] = {}
        self._needed: set[int] = set()
        self._needed_tensors: set[str] = set(self._requested)
        self._waiting_readers: dict[str, set[int]] = {}
        self._issued: set[int] = set()
        self._in_flight: set[int] = set()
        self._done: set[int] = set()
        self._call_batch: dict[int, int] = {}
        self._responses: list[_Response] = []
        self._releasable_refs: list[TensorRef] = []
        self._releasable_leases: list[Lease] = []
        self._result_leases: list[Lease] = []
        self._result: dict[str, TensorRef] | None = None
        self._error: Error | None = None
        problem = self._check_request(inputs)
        if problem:
            self._fail(Error(ErrorCode.INVALID_ARG, f"in ensemble '{plan.name}', {problem}"))
            return
        ensemble_batch = batch_size if plan.max_batch_size > 0 else 0
        for name in plan.inputs:
            ref = inputs.get(name)
            absent = f"the optional ensemble input '{name}' was not given" if ref is None else ""
            self._values[name] = _Value(ref, ensemble_batch, absent)
        self._select_needed_steps()
        self._check_success()

    # ---------------------------------------------------------------- queries

    def finished(self) -> bool:
        """The outcome is known and no step is in flight: answer the client now."""
        return (self._error is not None or self._result is not None) and not self._in_flight

    @property
    def error(self) -> Error | None:
        """The run's error as soon as it failed (steps may still be in flight)."""
        return self._error

    def in_flight(self) -> list[int]:
        """Indices of the steps issued and not yet done (to cancel them on failure)."""
        return sorted(self._in_flight)

    def result(self) -> dict[str, TensorRef] | Error:
        """Ensemble output name -> tensor (named and shaped as the ensemble's output; an output
        no composing model returned is left out, as in Triton), or the error."""
        if not self.finished():
            raise RuntimeError(f"ensemble '{self._plan.name}': the run has not finished")
        if self._error is not None:
            return self._error
        assert self._result is not None
        return dict(self._result)

    def result_leases(self) -> list[Lease]:
        """The leases behind ``result()``'s tensors: they go to the frontend with the answer."""
        return list(self._result_leases)

    def held_refs(self) -> list[TensorRef]:
        """The intermediate tensors this run keeps alive now (as the workers returned them)."""
        return [ref for response in self._responses for position, (_, ref)
                in enumerate(response.refs) if position not in response.released]

    def releasable_refs(self) -> list[TensorRef]:
        """The intermediate tensors no longer needed since the previous call (each once)."""
        refs, self._releasable_refs = self._releasable_refs, []
        return refs

    def releasable_leases(self) -> list[Lease]:
        """The step leases to release now (each once): none of their tensors is needed."""
        leases, self._releasable_leases = self._releasable_leases, []
        return leases

    # ---------------------------------------------------------------- transitions

    def ready_steps(self) -> list[StepCall]:
        """The steps whose inputs all exist and that were not issued yet, in plan order; they
        count as in flight from now on. [] once the run has failed or succeeded."""
        if self._error is not None or self._result is not None:
            return []
        calls: list[StepCall] = []
        for step in self._plan.steps:
            if step.index in self._issued or step.index not in self._needed:
                continue
            if any(spec.tensor not in self._values for spec in step.inputs.values()):
                continue
            call = self._build_call(step)
            if isinstance(call, str):
                self._fail(Error(ErrorCode.INVALID_ARG,
                                 f"in ensemble '{self._plan.name}', {step.label}: {call}"))
                return []
            calls.append(call)
        for call in calls:
            self._issued.add(call.step)
            self._in_flight.add(call.step)
        return calls

    def on_step_done(self, step_index: int, outcome: StepOutcome,
                     lease: Lease | None = None) -> None:
        """Step ``step_index`` answered: its outputs (by composing output name) with the lease
        over their memory, or its error. Raises ValueError for a step that is not in flight
        (a broker bug)."""
        if step_index not in self._in_flight:
            raise ValueError(f"ensemble '{self._plan.name}': step {step_index} is not in flight")
        self._in_flight.discard(step_index)
        self._done.add(step_index)
        step = self._plan.step(step_index)
        if isinstance(outcome, Error):
            if lease is not None:
                self._releasable_leases.append(lease)
            self._fail(Error(outcome.code, f"in ensemble '{self._plan.name}', {step.label}: "
                                           f"{outcome.message}"))
        else:
            self._record_outputs(step, outcome, lease)
        for spec in step.inputs.values():
            self._waiting_readers.get(spec.tensor, set()).discard(step_index)
        self._check_success()
        self._collect()

    def withdraw(self, step_index: int) -> None:
        """A call from ``ready_steps`` that the broker never issued (it was waiting for a slot
        when the run failed): it is no longer in flight and its inputs are not needed for it.
        Raises ValueError while the run can still succeed or for a step not in flight."""
        if self._error is None or step_index not in self._in_flight:
            raise ValueError(f"ensemble '{self._plan.name}': step {step_index} cannot be "
                             "withdrawn (not in flight, or the run has not failed)")
        self._in_flight.discard(step_index)
        self._done.add(step_index)
        for spec in self._plan.step(step_index).inputs.values():
            self._waiting_readers.get(spec.tensor, set()).discard(step_index)
        self._collect()

    def cancel(self, error: Error) -> None:
        """End the run with ``error`` (client cancel, timeout, unload); no further step is
        issued. No effect on a run whose outcome is already known."""
        self._fail(error)

    # ---------------------------------------------------------------- internals

    def _check_request(self, inputs: Mapping[str, TensorRef]) -> str:
        plan = self._plan
        for name in inputs:
            if name not in plan.inputs:
                return (f"unexpected input '{name}' in request header that does not map to any "
                        "ensemble inputs")
        for name in plan.inputs:
            if name not in inputs and name not in plan.optional_inputs:
                return f"ensemble input '{name}' is required but was not given"
        for name in self._requested:
            if name not in plan.outputs:
                return f"unexpected inference output '{name}' for model '{plan.name}'"
        return ""

    def _select_needed_steps(self) -> None:
        """Triton's pruning: a step runs only when a requested output depends on it."""
        plan = self._plan
        for step in reversed(plan.steps):
            if any(tensor in self._needed_tensors for tensor in step.output_map.values()):
                self._needed.add(step.index)
                self._needed_tensors.update(spec.tensor for spec in step.inputs.values())
        for index in self._needed:
            for spec in plan.step(index).inputs.values():
                self._waiting_readers.setdefault(spec.tensor, set()).add(index)

    def _build_call(self, step: EnsembleStep) -> StepCall | str:
        """The call for ``step``, or why its inputs do not fit its model."""
        batching = step.max_batch_size > 0
        inputs: dict[str, TensorRef] = {}
        for name, spec in step.inputs.items():
            value = self._values[spec.tensor]
            if value.ref is None:
                if spec.optional:
                    continue
                return f"input '{name}' has no data: {value.absent}"
            shape = adapt_shape(spec.dims, batching, value.batch_size, value.ref.shape)
            inputs[name] = msgspec.structs.replace(value.ref, name=name, shape=shape)
        checked = check_step_inputs(step, inputs)
        if isinstance(checked, str):
            return checked
        self._call_batch[step.index] = checked if batching else 0
        outputs = [self._requested_output(name, tensor)
                   for name, tensor in step.output_map.items() if tensor in self._needed_tensors]
        return StepCall(step.index, step.model_name, step.model_version, inputs, outputs,
                        checked if batching else 1)

    def _requested_output(self, name: str, tensor: str) -> RequestedOutput:
        wanted = self._requested.get(tensor)
        target = wanted.target if wanted is not None else None
        return RequestedOutput(name, target=target)

    def _record_outputs(self, step: EnsembleStep, outputs: Mapping[str, TensorRef],
                        lease: Lease | None) -> None:
        keep = self._error is None
        batch = self._call_batch[step.index]
        response = _Response(lease, [])
        for name, ref in outputs.items():
            tensor = step.output_map.get(name)
            if keep and tensor is not None and tensor in self._needed_tensors:
                self._values[tensor] = _Value(ref, batch)
                response.refs.append((tensor, ref))
            else:
                response.refs.append((None, ref))
        for name, tensor in step.output_map.items():
            if keep and name not in outputs and tensor in self._needed_tensors:
                self._values[tensor] = _Value(None, batch,
                                              f"{step.label} did not return output '{name}'")
        self._responses.append(response)

    def _fail(self, error: Error) -> None:
        if self._error is not None or self._result is not None:
            return
        self._error = error
        for readers in self._waiting_readers.values():
            readers.intersection_update(self._in_flight)
        self._collect()

    def _check_success(self) -> None:
        if self._error is not None or self._result is not None or not self._needed <= self._done:
            return
        batching = self._plan.max_batch_size > 0
        result: dict[str, TensorRef] = {}
        for name in self._requested:
            value = self._values.get(name)
            if value is None or value.ref is None:
                continue
            shape = adapt_shape(self._plan.output_dims[name], batching, value.batch_size,
                                value.ref.shape)
            result[name] = msgspec.structs.replace(value.ref, name=name, shape=shape)
        self._result = result

    def _held(self, tensor: str | None) -> bool:
        if tensor is None:
            return False
        if self._waiting_readers.get(tensor):
            return True
        return self._error is None and tensor in self._requested

    def _collect(self) -> None:
        """Move what is no longer needed to the releasable lists (and, on success, the result's
        leases to ``result_leases``); forget the responses that are settled."""
        succeeded = self._result is not None
        still_open: list[_Response] = []
        for response in self._responses:
            for position, (tensor, ref) in enumerate(response.refs):
                if position in response.released or (succeeded and tensor in self._requested):
                    continue
                if not self._held(tensor):
                    response.released.add(position)
                    self._releasable_refs.append(ref)
            if len(response.released) < len(response.refs) and not succeeded:
                still_open.append(response)
            elif response.lease is not None:
                settled = len(response.released) == len(response.refs)
                (self._releasable_leases if settled else self._result_leases).append(
                    response.lease)
        self._responses = still_open


def step_request(call: StepCall, parent: InferRequest, request_id: int) -> InferRequest:
    """The composing-model request for ``call``: the ensemble request's parameters, priority,
    timeout, sequence id and flags apply to every step (as in Triton); ``request_id`` is the
    broker's id for this step."""
    return InferRequest(
        request_id=request_id,
        model=call.model_name,
        version=call.model_version,
        inputs=list(call.inputs.values()),
        outputs=call.outputs,
        parameters=parent.parameters,
        client_request_id=parent.client_request_id,
        batch_size=call.batch_size,
        priority=parent.priority,
        timeout_us=parent.timeout_us,
        correlation_id=parent.correlation_id,
        flags=parent.flags,
    )
