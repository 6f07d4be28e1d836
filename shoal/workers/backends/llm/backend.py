"""The ``llm`` backend: one in-process ``shoal.llm.Executor`` per model instance,
served as a decoupled model (or, with ``decoupled: false``, as TensorRT-LLM's backend serves
one: see "Not decoupled" below).

``execute`` (worker main thread) turns each request into an executor ``Request`` (see
``interface.py``), checks it against the executor's limits (a bad request answers at once with
INVALID_ARG naming the input), enqueues it and returns None: the request stays open. After each
pass of the executor's loop, on its thread (``Executor.set_iteration_hook``), ``_deliver_ready``
takes the responses ready and streams each back through ``InstanceContext.send_response``, one
message per iteration; the executor's final result ends the request. (A thread of its own for
this contended for the GIL with the iteration's Python at every torch call: 11% fewer tokens/s
at 32 streaming clients.) In-flight batching happens in the executor, across requests that
arrive one by one. ``dynamic_batching`` is accepted as TensorRT-LLM's backend accepts it: the
broker's dynamic batcher hands queued requests over in batches (its ``preferred_batch_size`` /
``max_queue_delay_microseconds`` / queue policy apply, as Triton's core applies them), each
request of a batch is enqueued on its own, and ``default_queue_policy.max_queue_size`` (> 0)
also bounds the executor's queue of requests waiting to be admitted
(``ExecutorConfig.max_queue_size``). ``sequence_batching`` is refused.

Parameters and the executor they configure: ``executor_setup.py``.

Not decoupled (``model_transaction_policy { decoupled: false }``): each request gets exactly one
response, as from TensorRT-LLM's backend in that mode: streaming is refused ("Streaming is only
supported if model is deployed using decoupled mode.") and so is more than one sequence per
request ("Batch size > 1 requires ..."). ``execute`` enqueues every request of the batch, then
waits until each has its final result (collected by ``_collect`` from the executor's thread;
should that thread die, the waiting requests answer INTERNAL within ``LIVENESS_CHECK_S``)
and returns them: the requests of one batch run in flight together, and the next batch
starts when this one has ended (Triton's backend API lets TensorRT-LLM answer after
``execute`` returned; shoal's worker takes the answers of a non-decoupled model from
``execute``).

Cancellation: after each pass of the executor's loop the hook also reads the worker's
cancellation flags (a client that disconnected or cancelled: the broker sends
``CancelExecuting``) of every open request and cancels the executor request, which frees its KV
blocks at the start of the executor's next iteration; the request then ends without another
response. (While any request is open the executor iterates, so the flags are read every
iteration.)

Batches (``interface.py``; the open batch and its items: ``open_requests.py``; their
responses: ``answers.py``): a request of N items becomes N executor requests, enqueued together
(``Executor.enqueue_requests``) after every item passed ``check_request``. Streaming: each
executor response goes out at once as that item's response, and only the last item's final
result carries the final flag. Non-streaming: when the last item ends, one response stacks
them all. Cancellation reaches every item (they share the worker's request id). An item that
fails (an executor error or a response that cannot be built) sends its error at once and
cancels the other items; the request then ends when the last of them has.

Executor figures (requests, KV blocks, token counters, time to first token and between tokens)
are kept by ``figures.LlmFigures`` and read by the worker's heartbeat through ``llm_stats``;
frontend 0 renders them under TensorRT-LLM's backend names (``frontend/metrics/llm.py``).

Threads: ``execute``/``load``/``unload`` on the worker's main thread; the executor's loop
thread sends responses (those of one pass as one message to the broker,
``InstanceContext.stream_batch``); ``_lock`` guards the open-request table (held across enqueue
and registration so a response never arrives for an unknown request).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Final

from shoal.config.model_config import is_decoupled
from shoal.errors import ErrorCode, ShoalError, invalid_arg
from shoal.llm import Executor, Response
from shoal.messages import Error, LlmStats
from shoal.workers.backends.base import (
    BackendRequest,
    BackendResponse,
    CancelProbe,
    InstanceContext,
    OutputTensor,
    ResponseSink,
)
from shoal.workers.backends.llm.answers import item_outputs, item_response, stacked_response
from shoal.workers.backends.llm.chat_template import ChatTemplate, load_chat_template
from shoal.workers.backends.llm.executor_setup import create_executor
from shoal.workers.backends.llm.figures import LlmFigures
from shoal.workers.backends.llm.interface import BATCH_INDEX, parse_requests
from shoal.workers.backends.llm.logits import TokenLogprobs
from shoal.workers.backends.llm.open_requests import (
    OpenRequest,
    open_batch,
    open_item,
    refusal_not_decoupled,
)
from shoal.workers.backends.llm.prompt_bounds import UNBOUNDED, read_bounds
from shoal.workers.backends.llm.settings import model_parameters

if TYPE_CHECKING:
    from tokenizers import Tokenizer

logger = logging.getLogger(__name__)

# not decoupled: how often execute, waiting for the answers, checks the executor's loop lives
LIVENESS_CHECK_S: Final = 1.0


class LlmBackend:
    def __init__(self) -> None:
        self._executor: Executor | None = None
        self._tokenizer: Tokenizer | None = None
        self._chat_template: ChatTemplate | None = None
        self._eos: int | None = None
        self._bounds = UNBOUNDED  # the prompt size limits (prompt_bounds.py), set by load
        self._batching = False
        self._max_batch_size = 0
        self._declares_batch_index = False
        self._exclude_input = False
        self._send: ResponseSink | None = None
        self._is_cancelled: CancelProbe | None = None
        self._lock = threading.Lock()
        self._open: dict[int, OpenRequest] = {}  # executor request id -> open request
        self._figures: LlmFigures | None = None
        self._token_logprobs: TokenLogprobs | None = None
        self._stream_batch: Callable[[], AbstractContextManager[None]] = nullcontext
        self._decoupled = True
        # not decoupled: worker request id -> (its latest answer, whether its final came)
        self._collected: dict[int, tuple[BackendResponse | Error | None, bool]] = {}
        self._collect_done = threading.Condition()

    # ------------------------------------------------------------------ contract

    def load(self, ctx: InstanceContext) -> None:
        config = ctx.config
        self._decoupled = is_decoupled(config)
        if config.HasField("sequence_batching"):
            raise invalid_arg("llm backend: remove sequence_batching; the executor batches "
                              "requests in flight")
        if ctx.send_response is None or ctx.is_cancelled is None:
            raise invalid_arg("llm backend: the worker gave no response sink")
        executor, settings = create_executor(ctx)
        self._executor = executor
        if executor.tokenizer is not None:
            self._token_logprobs = TokenLogprobs(executor.tokenizer)
        self._tokenizer = executor.tokenizer
        self._chat_template = load_chat_template(settings.checkpoint_dir)
        self._eos = executor.model.spec.eos_token_id
        self._bounds = read_bounds(model_parameters(config), executor.limits.max_seq_len)
        self._batching = config.max_batch_size > 0
        self._max_batch_size = config.max_batch_size
        self._declares_batch_index = any(o.name == BATCH_INDEX for o in config.output)
        self._exclude_input = settings.exclude_input_in_output
        self._send, self._is_cancelled = ctx.send_response, ctx.is_cancelled
        if not self._decoupled:
            self._send = self._collect  # answers return from execute
        elif ctx.stream_batch is not None:
            self._stream_batch = ctx.stream_batch
        self._figures = LlmFigures(executor)
        executor.set_iteration_hook(self._deliver_ready)

    def execute(self, requests: list[BackendRequest]) -> list[BackendResponse | Error | None]:
        if self._decoupled:
            return [self._submit(request) for request in requests]
        return list(self._execute_to_the_end(requests))

    def _execute_to_the_end(self, requests: list[BackendRequest]
                            ) -> list[BackendResponse | Error]:
        """Not decoupled: enqueue every request, wait for each one's final result, return the
        answers (an Error for a request refused, failed or cancelled)."""
        executor = self._executor
        assert executor is not None, "execute() before load()"
        refused = [self._submit(request) for request in requests]
        running = {r.request_id for r, problem in zip(requests, refused, strict=True)
                   if problem is None}

        def finished() -> bool:
            return all(self._collected.get(i, (None, False))[1] for i in running)

        with self._collect_done:
            # the executor's loop thread answers; should it die (an error outside an
            # iteration), nothing would, so its life is checked at every wake-up
            while not finished() and executor.loop_alive():
                self._collect_done.wait(timeout=LIVENESS_CHECK_S)
            answers = {request_id: self._collected.pop(request_id, (None, False))
                       for request_id in running}
        stranded = {request_id for request_id, (_, final) in answers.items() if not final}
        if stranded:
            logger.error("llm backend: the LLM executor's loop thread has stopped; %d "
                         "request(s) answered INTERNAL", len(stranded))
            with self._lock:
                for executor_id in [k for k, o in self._open.items()
                                    if o.worker_id in stranded]:
                    del self._open[executor_id]
        results: list[BackendResponse | Error] = []
        for request, problem in zip(requests, refused, strict=True):
            answer, final = answers.get(request.request_id, (None, True))
            if problem is not None:
                results.append(problem)
            elif not final:
                results.append(Error(ErrorCode.INTERNAL, "the LLM executor has stopped"))
            else:
                results.append(answer if answer is not None else
                               Error(ErrorCode.CANCELLED, "the request was cancelled"))
        return results

    def _collect(self, request_id: int, answer: BackendResponse | Error | None,
                 final: bool) -> None:
        """The response sink when not decoupled (the executor's thread): keep the answer (a
        request that is not streamed has one), wake ``execute`` at the final one."""
        with self._collect_done:
            kept = self._collected.get(request_id, (None, False))[0]
            self._collected[request_id] = (answer if answer is not None else kept, final)
            if final:
                self._collect_done.notify_all()

    def unload(self) -> None:
        if self._executor is not None:
            self._executor.set_iteration_hook(None)
            self._executor.shutdown()

    # ------------------------------------------------------------------ requests in

    def _submit(self, request: BackendRequest) -> Error | None:
        executor = self._executor
        assert executor is not None, "execute() before load()"
        try:
            items = parse_requests(request, batching=self._batching, tokenizer=self._tokenizer,
                                   eos_token_id=self._eos, exclude_input=self._exclude_input,
                                   chat_template=self._chat_template,
                                   max_batch_size=self._max_batch_size, bounds=self._bounds)
        except ShoalError as exc:
            return Error(exc.code, exc.message)
        refusal = None if self._decoupled else refusal_not_decoupled(items)
        if refusal is not None:
            return refusal
        batch = open_batch(items, request.requested_outputs,
                           declares_batch_index=self._declares_batch_index, eos=self._eos)
        opened: list[OpenRequest] = []
        for index, parsed in enumerate(items):
            item = open_item(request, parsed, batch, index, executor=executor,
                             tokenizer=self._tokenizer, token_logprobs=self._token_logprobs)
            if isinstance(item, Error):
                return item
            opened.append(item)
        with self._lock:
            try:
                executor_ids = executor.enqueue_requests([o.parsed.request for o in opened])
            except ShoalError as exc:  # a full queue (max_queue_size), a shut-down executor
                return Error(exc.code, exc.message)
            for executor_id, open_request in zip(executor_ids, opened, strict=True):
                open_request.executor_id = executor_id
                self._open[executor_id] = open_request
                if self._figures is not None:
                    open_request.clock = self._figures.accepted(
                        len(open_request.parsed.request.input_token_ids))
                    batch.clocks[open_request.index] = open_request.clock
        return None

    # ------------------------------------------------------------------ responses out

    def _deliver_ready(self) -> None:
        """The executor's iteration hook (its loop thread): deliver what is ready, as one
        message, and forward the cancellations."""
        executor = self._executor
        assert executor is not None
        try:
            responses = executor.await_responses(timeout=0)
            with self._lock, self._stream_batch():  # an iteration's tokens: one message
                for response in responses:
                    self._deliver(response)
                self._forward_cancels(executor)
            if self._figures is not None:
                self._figures.executor_turn(len(self._open))
        except Exception:  # delivery must survive one bad response
            logger.exception("llm backend: failed to deliver a response")

    def _deliver(self, response: Response) -> None:
        """Send one executor response to its request (caller holds ``_lock``)."""
        open_request = self._open.get(response.request_id)
        if open_request is None:
            return
        batch = open_request.batch
        result = response.result
        item_final = response.has_error() or (result is not None and result.is_final)
        if item_final:
            del self._open[response.request_id]
            batch.pending -= 1
        final = item_final and batch.pending == 0  # the client request's last response
        if response.has_error() or result is None:
            self._fail(open_request, Error(ErrorCode.INTERNAL, response.error_msg or "no result"),
                       final)
            return
        outputs: list[OutputTensor] | None = None
        if not open_request.cancelled:
            if open_request.clock is not None:
                open_request.clock.produce(open_request.parsed.request, result)
            try:
                outputs = item_outputs(open_request, result, item_final,
                                       exclude_input=self._exclude_input,
                                       tokenizer=self._tokenizer)
            except Exception as exc:  # fail this request only; the executor stops it
                logger.exception("llm backend: cannot build a response")
                self._fail(open_request, Error(ErrorCode.INTERNAL,
                                               f"cannot build the response: {exc}"), final)
                return
        if batch.streaming or batch.size == 1:
            self._send_item(open_request, outputs, item_final, final)
        else:  # non-streaming batch: hold the item until the last one ends
            if item_final:
                batch.held[open_request.index] = outputs
            if final:
                self._send_stacked(open_request)

    def _send_item(self, open_request: OpenRequest, outputs: list[OutputTensor] | None,
                   item_final: bool, final: bool) -> None:
        """One item's outputs as a response of its own (a batch dimension of 1, and
        ``batch_index`` when the batch sends it); ``outputs`` None: a held-back text piece or a
        cancelled item, which only closes the request when it is the last."""
        answer = None if outputs is None else item_response(open_request, outputs,
                                                             batching=self._batching)
        self._count_sent(open_request, answer, item_final)
        if answer is not None or final:
            self._send_quietly(open_request.worker_id, answer, final)

    def _send_stacked(self, last: OpenRequest) -> None:
        """The final response of a non-streaming batch: every item's outputs stacked, or only
        the final flag when an item failed or was cancelled."""
        batch = last.batch
        answer: BackendResponse | Error | None = None
        items = [outputs for outputs in batch.held if outputs is not None]
        if not batch.failed and len(items) == batch.size:
            try:
                answer = stacked_response(batch, items)
            except Exception as exc:
                logger.exception("llm backend: cannot build a response")
                answer = Error(ErrorCode.INTERNAL, f"cannot build the response: {exc}")
        if self._figures is not None:
            for clock in batch.clocks:
                if clock is not None:
                    if isinstance(answer, BackendResponse):
                        self._figures.tokens_sent(clock)
                    self._figures.finished(clock)
        self._send_quietly(last.worker_id, answer, True)

    def _fail(self, open_request: OpenRequest, error: Error, final: bool) -> None:
        """An item failed (its final result, or a response that cannot be built): send
        ``error``, once per request, and cancel the batch's other items (and this one when it
        still runs); their remaining responses only close the request."""
        batch = open_request.batch
        open_request.cancelled = True
        if self._figures is not None:  # this item ended; with the request's end, all have
            for clock in batch.clocks if final else [open_request.clock]:
                if clock is not None:
                    self._figures.finished(clock)
        executor = self._executor
        assert executor is not None
        if open_request.executor_id in self._open:
            executor.cancel_request(open_request.executor_id)
        if batch.failed:  # the request already has its error
            if final:
                self._send_quietly(open_request.worker_id, None, True)
            return
        batch.failed = True
        for executor_id, other in self._open.items():
            if other.batch is batch and not other.cancelled:
                other.cancelled = True
                executor.cancel_request(executor_id)
        self._send_quietly(open_request.worker_id, error, final)

    def _count_sent(self, open_request: OpenRequest, answer: BackendResponse | Error | None,
                    final: bool) -> None:
        """Metrics: the response leaves now (its tokens, and the request's end when final)."""
        figures, clock = self._figures, open_request.clock
        if figures is None or clock is None:
            return
        if isinstance(answer, BackendResponse):
            figures.tokens_sent(clock)
        if final:
            figures.finished(clock)

    def llm_stats(self) -> LlmStats | None:
        """The executor figures now (the worker's control thread ships them on its heartbeat)."""
        return self._figures.snapshot() if self._figures is not None else None

    def _send_quietly(self, worker_id: int, answer: BackendResponse | Error | None,
                      final: bool) -> None:
        assert self._send is not None
        try:
            self._send(worker_id, answer, final)
        except ShoalError as exc:  # the request was already closed (e.g. warmup timed out)
            logger.debug("llm backend: response dropped: %s", exc.message)

    def _forward_cancels(self, executor: Executor) -> None:
        assert self._is_cancelled is not None
        for executor_id, open_request in self._open.items():
            if not open_request.cancelled and self._is_cancelled(open_request.worker_id):
                open_request.cancelled = True
                executor.cancel_request(executor_id)

