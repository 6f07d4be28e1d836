"""The llm backend's executor figures (``messages.LlmStats``): what ``/metrics``, the model
statistics and the ops dashboard show of an ``llm`` model instance.

Where each figure is taken:

- Time to first token and inter-token latency are measured here, in the worker, at the moment a
  response leaves for the broker (``tokens_sent``, called just before ``send_response``). The
  clock starts when the backend accepts the request (``accepted``, in ``execute``): the broker's
  queue and the frontend are not included. TTFT is observed once per request, at the first
  response that carries a token. Every later token gives one inter-token observation: a
  response carrying ``k`` tokens after a gap ``d`` since the previous token-bearing response of
  the request counts ``k`` gaps of ``d / k`` (tokens held back with a partial character leave,
  and count, with the response that carries them). Tokens of the first response beyond the first one
  left together with it and count gaps of 0 (a non-streaming request: TTFT is its whole
  generation and its other tokens add zeros). So over any set of requests that produced
  tokens, TTFT's count is the number of requests and the inter-token count is generated tokens
  minus requests.
- Generated tokens are counted when they leave (beam 0 of every returned sequence; the end token
  that finished a sequence counts, as the ``completion_tokens`` output and OpenAI's usage count
  it). Prompt tokens are counted when the executor accepts the request.
- Requests, KV blocks and the iteration counter are read after each pass of the executor's
  loop (the backend's iteration hook): blocks straight from the executor's block manager (so
  blocks freed by a cancel show although no iteration follows it), requests from the
  executor's latest ``IterationStats`` (all zero while the backend holds no open request).

Thread-safe: ``execute`` (main thread), the executor's loop thread and the worker's control
thread (``snapshot`` for the heartbeat) call in; one lock guards the values.
"""

from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from shoal.llm import FinishReason, Request, Result
from shoal.messages import LATENCY_BUCKET_BOUNDS_US, TOKEN_LEN_BOUNDS, LlmStats

if TYPE_CHECKING:
    from shoal.llm import Executor


@dataclass
class RequestClock:
    """One request's timeline and the tokens counted so far (per returned sequence)."""

    accepted_at: float  # time.perf_counter() when the backend accepted it
    prompt_tokens: int
    last_token_at: float | None = None  # when the previous token-bearing response left
    produced: dict[int, int] = field(default_factory=dict)  # sequence index -> tokens so far
    unsent: int = 0  # produced tokens held back (a partial character) that have not left yet
    sent: int = 0  # tokens that left
    finished: bool = False

    def produce(self, request: Request, result: Result) -> None:
        """Count the tokens ``result`` adds (see ``new_tokens``) as produced, not yet sent."""
        added = new_tokens(request, result, self)
        if added:
            index = result.sequence_index
            self.produced[index] = self.produced.get(index, 0) + added
            self.unsent += added


def new_tokens(request: Request, result: Result, clock: RequestClock) -> int:
    """Generated tokens ``result`` adds for its sequence (beam 0) beyond those already produced
    in ``clock``; the end token that finished the sequence counts as one. Follows the token
    conventions of ``shoal.llm.request``: a streaming result holds the new tokens only,
    unless ``return_all_generated_tokens`` or beam search make it hold all generated so far; a
    non-streaming result holds the whole sequence, after the prompt unless the prompt is
    excluded."""
    beams = result.output_token_ids
    length = len(beams[0]) if beams else 0
    index = result.sequence_index
    seen = clock.produced.get(index, 0)
    cumulative = (not request.streaming or request.return_all_generated_tokens
                  or request.sampling_config.beam_width > 1)
    if not cumulative:
        total = seen + length
    else:
        prompt = 0 if (request.streaming or request.output_config.exclude_input_from_output) \
            else len(request.input_token_ids)
        total = max(length - prompt, 0)
    ended = (result.is_final or result.is_sequence_final) and bool(result.finish_reasons) \
        and result.finish_reasons[0] is FinishReason.END_ID
    return max(total + (1 if ended else 0) - seen, 0)


def _bucket(bounds: tuple[int, ...], value: float) -> int:
    return bisect.bisect_left(bounds, value)  # upper bounds inclusive


def _observe(counts: list[int], bounds: tuple[int, ...], value: float, times: int = 1) -> None:
    if not counts:
        counts.extend([0] * (len(bounds) + 1))
    counts[_bucket(bounds, value)] += times


def model_bytes(model: object) -> int:
    """Bytes of the torch tensors reachable from ``model``'s attributes: its weights and
    tables (rotary). Lists, tuples, dicts and objects of shoal's own classes are followed,
    nothing else; a storage shared by two tensors (tied embeddings) counts once."""
    import torch

    seen: set[tuple[int, int]] = set()
    total = 0
    stack: list[Any] = [model]
    visited: set[int] = set()
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            key = (item.untyped_storage().data_ptr(), item.untyped_storage().nbytes())
            if key not in seen:
                seen.add(key)
                total += key[1]
            continue
        if id(item) in visited:
            continue
        visited.add(id(item))
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif type(item).__module__.startswith("shoal.") and hasattr(item, "__dict__"):
            stack.extend(vars(item).values())
    return total


class LlmFigures:
    """The figures of one executor (one model instance)."""

    def __init__(self, executor: Executor) -> None:
        self._lock = threading.Lock()
        self._executor = executor
        self._stats = LlmStats(
            max_requests=executor.config.max_batch_size,
            kv_blocks_max=executor.blocks.num_blocks,
            kv_blocks_free=executor.blocks.free_blocks,
            kv_tokens_per_block=executor.blocks.tokens_per_block,
            kv_pool_bytes=executor.kv.nbytes, weights_bytes=model_bytes(executor.model),
            accelerator_bytes=0 if executor.config.device == "cpu" else
            executor.kv.nbytes + model_bytes(executor.model))
        self._ttft: list[int] = []
        self._ttft_us = 0.0
        self._itl: list[int] = []
        self._itl_us = 0.0
        self._input_len: list[int] = []
        self._output_len: list[int] = []
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._finished = 0
        self._finished_tokens = 0

    # ------------------------------------------------------------------ per request

    def accepted(self, prompt_tokens: int) -> RequestClock:
        """A request the executor accepted (call right after ``enqueue_request``)."""
        clock = RequestClock(time.perf_counter(), prompt_tokens)
        with self._lock:
            self._prompt_tokens += prompt_tokens
            _observe(self._input_len, TOKEN_LEN_BOUNDS, prompt_tokens)
        return clock

    def tokens_sent(self, clock: RequestClock) -> None:
        """A response leaves now for the broker with the tokens produced and not yet sent."""
        count = clock.unsent
        if count <= 0:
            return
        now = time.perf_counter()
        clock.unsent, clock.sent = 0, clock.sent + count
        with self._lock:
            self._generation_tokens += count
            gaps = count
            if clock.last_token_at is None:
                first_us = (now - clock.accepted_at) * 1e6
                _observe(self._ttft, LATENCY_BUCKET_BOUNDS_US, first_us)
                self._ttft_us += first_us
                gaps -= 1
                gap_us = 0.0  # the first response's other tokens left with it
            else:
                gap_us = (now - clock.last_token_at) * 1e6 / count
            if gaps > 0:
                _observe(self._itl, LATENCY_BUCKET_BOUNDS_US, gap_us, gaps)
                self._itl_us += gap_us * gaps
        clock.last_token_at = now

    def finished(self, clock: RequestClock) -> None:
        """The request's final response left (or it ended with an error)."""
        if clock.finished:
            return
        clock.finished = True
        with self._lock:
            self._finished += 1
            self._finished_tokens += clock.sent
            _observe(self._output_len, TOKEN_LEN_BOUNDS, clock.sent)

    # ------------------------------------------------------------------ executor state

    def executor_turn(self, open_requests: int) -> None:
        """Read the executor's blocks and latest iteration statistics (after each pass of the
        executor's loop)."""
        executor = self._executor
        iterations = executor.get_latest_iteration_stats()
        blocks = executor.blocks
        free = blocks.free_blocks  # reusable (prefix-cached, unreferenced) blocks count free
        changes: dict[str, int] = {
            "kv_blocks_free": free, "kv_blocks_used": blocks.num_blocks - free,
            "kv_blocks_reused": int(getattr(blocks, "reused_blocks", 0)),
        }
        if iterations:
            last = iterations[-1]
            batch = last.inflight_batching_stats
            changes.update(
                iterations=last.iter,
                active_requests=last.num_active_requests - last.num_completed_requests,
                queued_requests=last.num_queued_requests,
                scheduled_requests=batch.num_scheduled_requests,
                context_requests=batch.num_context_requests,
                generation_requests=batch.num_gen_requests,
                paused_requests=batch.num_paused_requests,
                context_tokens=batch.num_ctx_tokens)
        if open_requests == 0:
            changes.update(active_requests=0, queued_requests=0, scheduled_requests=0,
                           context_requests=0, generation_requests=0, paused_requests=0,
                           context_tokens=0)
        with self._lock:
            self._stats = _replace(self._stats, changes)

    # ------------------------------------------------------------------ out

    def snapshot(self) -> LlmStats:
        with self._lock:
            return _replace(self._stats, {}, time_to_first_token=list(self._ttft),
                            time_to_first_token_us=self._ttft_us, inter_token=list(self._itl),
                            inter_token_us=self._itl_us, input_token_len=list(self._input_len),
                            output_token_len=list(self._output_len),
                            prompt_tokens=self._prompt_tokens,
                            generation_tokens=self._generation_tokens,
                            requests_finished=self._finished,
                            finished_generation_tokens=self._finished_tokens)


def _replace(stats: LlmStats, changes: dict[str, int], **more: Any) -> LlmStats:
    return msgspec.structs.replace(stats, **changes, **more)
