"""``Executor``: TensorRT-LLM's Executor API in-process, on torch.

The executor loads a Hugging Face checkpoint, reserves the KV-cache pool once, and runs its
iteration loop in a background thread: each iteration admits queued requests alongside running
ones (in-flight batching, see ``scheduler.py``), computes one token per running sequence, and
publishes responses. ``enqueue_request(s)``, ``await_responses``, ``cancel_request``,
``get_latest_*_stats`` and ``shutdown`` may be called from any thread.

Request ids are issued by the executor (1, 2, ...). A request that fails validation gets its id
and one error response; other requests never notice. ``await_responses`` for an id whose final
response was already taken answers with an error response, as TRT-LLM does.
"""

from __future__ import annotations

import copy
import datetime
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, overload

from shoal.errors import unavailable
from shoal.llm.config import ExecutorConfig
from shoal.llm.engine import Engine
from shoal.llm.guided.decoder import GuidedDecoder, guided_request_error
from shoal.llm.kv_cache import BlockManager, KvCachePool
from shoal.llm.logits.post_process import LogitsPostProcessing
from shoal.llm.models import load_model
from shoal.llm.request import Request, Response, Result
from shoal.llm.scheduler import Scheduler
from shoal.llm.sequence import RequestState
from shoal.llm.stats import IterationStats, RequestStatsPerIteration
from shoal.llm.stats_collector import StatsCollector
from shoal.llm.validation import Limits, request_error

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from shoal.llm.kv_cache import DeviceWorkspace

logger = logging.getLogger(__name__)

Timeout = float | datetime.timedelta | None


class Executor:
    def __init__(self, model_dir: str | Path, executor_config: ExecutorConfig | None = None,
                 *, workspace: DeviceWorkspace | None = None) -> None:
        """Load the checkpoint in ``model_dir`` onto ``executor_config.device``. The KV pool is
        carved from ``workspace`` when one is given (the worker's device workspace), else
        allocated here, once."""
        from shoal.llm.checkpoint import load_tokenizer

        config = executor_config or ExecutorConfig()
        self.config = config
        self.model = load_model(model_dir, config.device, config.dtype)
        self.tokenizer: Tokenizer | None = load_tokenizer(model_dir)
        spec = self.model.spec
        max_seq_len = min(config.max_seq_len or spec.max_position_embeddings,
                          spec.max_position_embeddings)
        tokens_per_block = config.kv_cache_config.tokens_per_block
        num_blocks = _num_blocks(config, max_seq_len)
        self.kv = KvCachePool.allocate(
            num_layers=spec.num_layers, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
            num_blocks=num_blocks, tokens_per_block=tokens_per_block, dtype=self.model.dtype,
            device=config.device, workspace=workspace)
        self.blocks = BlockManager(num_blocks, tokens_per_block,
                                   enable_reuse=config.kv_cache_config.enable_block_reuse)
        scheduler: Scheduler[RequestState] = Scheduler(
            blocks=self.blocks, policy=config.scheduler_config.capacity_scheduler_policy,
            batching=config.batching_type, max_batch_size=config.max_batch_size,
            max_num_tokens=config.max_num_tokens,
            enable_chunked_context=config.enable_chunked_context)
        post_processing = LogitsPostProcessing(config.logits_post_processor_config)
        self._engine = Engine(self.model, self.kv, self.blocks, scheduler, post_processing)
        self.limits = Limits(vocab_size=spec.vocab_size, max_beam_width=config.max_beam_width,
                             max_seq_len=max_seq_len, num_blocks=num_blocks,
                             tokens_per_block=tokens_per_block,
                             logits_post_processors=post_processing.names)
        self._guided: GuidedDecoder | None = None
        if config.guided_decoding_config is not None:
            self._guided = GuidedDecoder(config.guided_decoding_config, spec.vocab_size)
        self._engine.guided = self._guided
        self._stats = StatsCollector(config, self.blocks)
        self._last_id = 0  # request ids are 1, 2, ...
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # loop thread waits for requests
        self._ready = threading.Condition(self._lock)  # await_responses waits for responses
        self._inbox: list[RequestState] = []
        # requests the scheduler holds, not yet admitted (set by the loop thread after each
        # pass; an int store, read under _lock by enqueue_requests for max_queue_size)
        self._queued = 0
        self._cancels: list[int] = []
        self._live: dict[int, int | None] = {}  # request id -> client id, until final response
        self._responses: dict[int, deque[tuple[int, Response]]] = {}
        self._stopped = False
        self._iteration_hook: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._loop, name="llm-executor", daemon=True)
        self._thread.start()
        logger.info("LLM executor ready: %s, %d layers, KV pool %d blocks x %d tokens (%.1f MiB)"
                    " on %s", spec.architecture, spec.num_layers, num_blocks, tokens_per_block,
                    self.kv.nbytes / 2**20, config.device)

    # --- client side (any thread) ---

    def enqueue_request(self, request: Request) -> int:
        return self.enqueue_requests([request])[0]

    def enqueue_requests(self, requests: list[Request]) -> list[int]:
        """Ids of ``requests``, in order; a request that fails ``check_request`` gets its error
        as its only response. Raises UNAVAILABLE, enqueuing none of them, when the executor is
        shut down or when ``max_queue_size`` (> 0) requests would be exceeded by those waiting
        to be admitted (TensorRT-LLM's message)."""
        checked = [(copy.deepcopy(r), self.check_request(r)) for r in requests]
        now = time.monotonic()
        ids: list[int] = []
        limit = self.config.max_queue_size
        with self._lock:
            if self._stopped:
                raise unavailable("the LLM executor has been shut down")
            adding = sum(1 for _, error in checked if error is None)
            if limit and adding and len(self._inbox) + self._queued + adding > limit:
                raise unavailable(f"Maximum queue size of {limit} has been reached, please "
                                  "try again later")
            for request, error in checked:
                self._last_id += 1
                ids.append(self._last_id)
                if error is None:
                    self._live[self._last_id] = request.client_id
                    self._inbox.append(RequestState(self._last_id, request, now))
                else:
                    self._push(Response(self._last_id, error_msg=error,
                                        client_id=request.client_id))
            self._work.notify()
            self._ready.notify_all()
        return ids

    def set_iteration_hook(self, hook: Callable[[], None] | None) -> None:
        """Run ``hook`` on the executor's loop thread after every pass of its loop (an
        iteration, or cancellations) and whenever responses are ready while it is idle; the hook
        takes them with ``await_responses(timeout=0)``. A server delivers responses this way,
        between iterations: from a thread of its own it would contend for the GIL with the
        iteration's Python at every torch call (measured: 11% fewer tokens/s through the
        server). The hook must not block for long (the next iteration waits for it); what it
        raises is logged. None removes it."""
        with self._lock:
            self._iteration_hook = hook
            self._work.notify()

    def check_request(self, request: Request) -> str | None:
        """The first problem ``enqueue_request`` would answer ``request`` with (a message for
        the client), or None. Compiles a guided request's grammar (then cached)."""
        return request_error(request, self.limits) or guided_request_error(request, self._guided)

    def cancel_request(self, request_id: int) -> None:
        """Ask for the request to end; it answers with a final result whose finish reason is
        CANCELLED (unless it finished first). Unknown ids are ignored."""
        with self._lock:
            if request_id in self._live:
                self._cancels.append(request_id)
                self._work.notify()

    @overload
    def await_responses(self, id: None = None, timeout: Timeout = None) -> list[Response]: ...

    @overload
    def await_responses(self, id: int, timeout: Timeout = None) -> list[Response]: ...

    @overload
    def await_responses(self, id: list[int], timeout: Timeout = None) -> list[list[Response]]: ...

    def await_responses(self, id: int | list[int] | None = None,
                        timeout: Timeout = None) -> list[Response] | list[list[Response]]:
        """Responses ready for any request (``id`` None), for one request, or for each of a
        list of requests; blocks until at least one is ready or ``timeout`` (seconds or a
        timedelta; None waits indefinitely) passes, and then returns what is ready (maybe
        nothing)."""
        wanted = None if id is None else [id] if isinstance(id, int) else list(id)
        deadline = _deadline(timeout)
        with self._lock:
            while not self._any_ready(wanted) and not self._stopped:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._ready.wait(remaining)
            if wanted is None:
                merged = sorted(p for queue in self._responses.values() for p in queue)
                for request_id in list(self._responses):
                    self._take(request_id)
                return [response for _, response in merged]
            taken = [self._take(request_id) for request_id in wanted]
        return taken[0] if isinstance(id, int) else taken

    def get_num_responses_ready(self, id: int | None = None) -> int:
        with self._lock:
            if id is None:
                return sum(len(q) for q in self._responses.values())
            return len(self._responses.get(id, ()))

    def get_latest_iteration_stats(self) -> list[IterationStats]:
        """Statistics of the iterations since the previous call (at most
        ``iter_stats_max_iterations``)."""
        return self._stats.take_iterations()

    def get_latest_request_stats(self) -> list[RequestStatsPerIteration]:
        return self._stats.take_requests()

    def can_enqueue_requests(self) -> bool:
        with self._lock:
            return not self._stopped

    def loop_alive(self) -> bool:
        """Whether the loop thread still runs (False after ``shutdown``, or once it died of an
        error outside an iteration: nothing would answer the requests then)."""
        return self._thread.is_alive()

    def shutdown(self) -> None:
        """Stop the loop; requests still live end with an error response."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._work.notify()
        self._thread.join()
        with self._lock:
            for request_id, client_id in list(self._live.items()):
                self._push(Response(request_id, error_msg="the LLM executor shut down",
                                    client_id=client_id))
            self._ready.notify_all()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # --- response queues (caller holds the lock) ---

    def _push(self, response: Response) -> None:
        self._responses.setdefault(response.request_id, deque()).append(
            (next(self._order), response))
        result = response.result
        if response.has_error() or (result is not None and result.is_final):
            self._live.pop(response.request_id, None)

    def _any_ready(self, wanted: list[int] | None) -> bool:
        if wanted is None:
            return bool(self._responses)
        return any(self._responses.get(i) or i not in self._live for i in wanted)

    def _take(self, request_id: int) -> list[Response]:
        queue = self._responses.pop(request_id, None)
        if queue is not None:
            return [response for _, response in queue]
        if request_id in self._live:
            return []
        if 0 < request_id <= self._last_id:
            message = f"ReqId {request_id} has already been processed and was terminated."
        else:
            message = f"ReqId {request_id} is not a known request id"
        return [Response(request_id, error_msg=message)]

    # --- loop thread ---

    def _loop(self) -> None:
        while True:
            with self._lock:
                while (not self._stopped and not self._inbox and not self._cancels
                       and not self._engine.has_work
                       and not (self._iteration_hook is not None and self._any_ready(None))):
                    self._work.wait()
                if self._stopped:
                    return
                inbox, self._inbox = self._inbox, []
                self._queued += len(inbox)  # they join the scheduler's queue below
                cancels, self._cancels = self._cancels, []
                hook = self._iteration_hook
            for state in inbox:
                self._engine.add(state)
            if cancels:
                self._publish([(i, r) for i in cancels for r in self._engine.cancel(i)])
            if self._engine.has_work:
                self._iterate()
            self._queued = len(self._engine.scheduler.waiting)
            if hook is not None:
                try:
                    hook()
                except Exception:
                    logger.exception("LLM executor: the iteration hook failed")
                    time.sleep(0.01)  # what it left must not make the loop spin

    def _iterate(self) -> None:
        started = time.perf_counter()
        try:
            report = self._engine.step()
        except Exception:
            logger.exception("LLM iteration failed; failing the requests in flight")
            failed = self._engine.abort_all()
            with self._lock:
                for request_id in failed:
                    self._push(Response(request_id, error_msg="internal error in the LLM "
                                        "executor iteration", client_id=self._live.get(request_id)))
                self._ready.notify_all()
            return
        self._publish(report.results)
        self._fail(report.errors)
        self._stats.record(report, self._engine, (time.perf_counter() - started) * 1000.0)
        if not report.scheduled and not report.num_paused:
            time.sleep(0.001)  # nothing could run (should not happen); do not spin hot

    def _publish(self, results: list[tuple[int, Result]]) -> None:
        if not results:
            return
        with self._lock:
            for request_id, result in results:
                client_id = self._live.get(request_id)
                self._push(Response(request_id, result=result, client_id=client_id))
            self._ready.notify_all()


    def _fail(self, errors: list[tuple[int, str]]) -> None:
        """Error responses (final) for requests that failed in an iteration."""
        if not errors:
            return
        with self._lock:
            for request_id, message in errors:
                self._push(Response(request_id, error_msg=message,
                                    client_id=self._live.get(request_id)))
            self._ready.notify_all()


def _num_blocks(config: ExecutorConfig, max_seq_len: int) -> int:
    kv = config.kv_cache_config
    if kv.num_blocks is not None:
        return kv.num_blocks
    tokens = kv.max_tokens
    if tokens is None:
        tokens = config.max_batch_size * config.max_beam_width * max_seq_len
    return math.ceil(tokens / kv.tokens_per_block)


def _deadline(timeout: Timeout) -> float | None:
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
    return time.monotonic() + max(0.0, seconds)
