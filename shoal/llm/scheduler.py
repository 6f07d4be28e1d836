"""Iteration-level (in-flight) scheduling: a pure, clock-free state machine (docs/architecture.md
§7).

Each call to ``schedule`` decides one iteration:

1. Running requests keep their place. Under MAX_UTILIZATION the blocks each one's next tokens
   need are taken in admission order; when the free blocks run out, the most recently admitted
   requests are paused (their blocks return to the pool; they go back to the front of the
   queue, oldest first, and resume by recomputing). GUARANTEED_NO_EVICT reserved every block a
   request could need when it was admitted, so nothing is ever paused.
2. Waiting requests are admitted first-come first-served (the first one that does not fit stops
   admission, so nobody is overtaken) while the iteration has room: ``max_batch_size`` requests,
   ``max_num_tokens`` tokens, KV blocks as the policy says (a context longer than
   ``max_num_tokens`` is admitted when it reaches the head of the queue and runs alone in its
   iteration, so it is never starved), and the same beam width as the running requests
   (TRT-LLM's rule: a request of another width waits until the running ones have drained,
   then the width switches). With STATIC
   batching nothing is admitted while any request runs.

Chunked context (``enable_chunked_context``): generating requests are served first; then a
context that does not fit what is left of ``max_num_tokens`` gets a chunk of it, a whole number
of KV blocks (at least one block when nothing else runs), and the rest in later iterations, so
a long prompt no longer stalls the running generations. Only a request computing one sequence
(``chunkable``) is chunked; the others keep the rule above. ``Schedule.chunks`` names the
requests cut short and their tokens.

The scheduler never touches tensors or the clock; the caller releases the blocks of paused
requests before running the iteration, and calls ``remove`` when a request finishes or is
cancelled. Threads: executor loop thread only.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from shoal.llm.config import BatchingType, CapacitySchedulerPolicy
from shoal.llm.kv_cache import BlockManager


class Schedulable(Protocol):
    request_id: int
    beam_width: int

    def step_tokens(self, blocks: BlockManager) -> int:
        """Tokens the request's next iteration computes when it runs whole (a prefix found in
        the reused blocks excluded)."""
        ...

    def chunkable(self) -> bool:
        """Whether those tokens may be split over iterations (chunked context)."""
        ...

    def step_block_demand(self, blocks: BlockManager, num_tokens: int) -> int:
        """Free blocks the request's next iteration takes when it computes ``num_tokens`` of
        them (all of them for a request that is not chunkable)."""
        ...

    def freeable_blocks(self, blocks: BlockManager) -> int:
        """Blocks returned to the pool if the request is paused now."""
        ...

    def max_block_demand(self, tokens_per_block: int) -> int:
        """Most blocks the request can hold at once before it finishes."""
        ...


R = TypeVar("R", bound=Schedulable)


@dataclass
class Schedule(Generic[R]):
    scheduled: list[R] = field(default_factory=list)  # run this iteration, admission order
    admitted: list[R] = field(default_factory=list)  # newly admitted (also in ``scheduled``)
    paused: list[R] = field(default_factory=list)  # release their blocks before the iteration
    chunks: dict[int, int] = field(default_factory=dict)  # request id -> tokens, when fewer
    # than its ``step_tokens`` (a context chunk)


class Scheduler(Generic[R]):
    def __init__(self, *, blocks: BlockManager, policy: CapacitySchedulerPolicy,
                 batching: BatchingType, max_batch_size: int, max_num_tokens: int,
                 enable_chunked_context: bool = False) -> None:
        self._blocks = blocks
        self._chunked = enable_chunked_context
        self._policy = policy
        self._batching = batching
        self._max_batch_size = max_batch_size
        self._max_num_tokens = max_num_tokens
        self._waiting: deque[R] = deque()
        self._running: list[R] = []
        self._reserved: dict[int, int] = {}  # GUARANTEED_NO_EVICT: request id -> blocks

    @property
    def waiting(self) -> list[R]:
        return list(self._waiting)

    @property
    def running(self) -> list[R]:
        return list(self._running)

    def add(self, request: R) -> None:
        self._waiting.append(request)

    def remove(self, request_id: int) -> R | None:
        """Forget a finished or cancelled request (running or waiting); its blocks are the
        caller's to release."""
        self._reserved.pop(request_id, None)
        for index, request in enumerate(self._running):
            if request.request_id == request_id:
                return self._running.pop(index)
        for request in self._waiting:
            if request.request_id == request_id:
                self._waiting.remove(request)
                return request
        return None

    def schedule(self) -> Schedule[R]:
        plan: Schedule[R] = Schedule()
        free = self._blocks.free_blocks
        if self._policy is CapacitySchedulerPolicy.MAX_UTILIZATION:
            free = self._pause_until_running_fits(plan, free)
        tokens_left = self._max_num_tokens
        for request in self._in_serving_order():
            tokens = request.step_tokens(self._blocks)
            if self._chunked and request.chunkable():
                tokens = self._grant(request, tokens, tokens_left, plan)
                if not tokens:
                    continue
            elif tokens > tokens_left and plan.scheduled:
                continue  # waits an iteration; keeps its blocks
            plan.scheduled.append(request)
            tokens_left -= tokens
        if self._batching is BatchingType.STATIC and self._running:
            return plan
        self._admit(plan, free, tokens_left)
        return plan

    def _in_serving_order(self) -> list[R]:
        if not self._chunked:
            return self._running
        # generating requests first: a context chunk takes what they leave
        return ([r for r in self._running if not r.chunkable()]
                + [r for r in self._running if r.chunkable()])

    def _grant(self, request: R, tokens: int, tokens_left: int, plan: Schedule[R]) -> int:
        """Tokens a chunkable request computes this iteration (0: none); records a chunk."""
        if tokens <= tokens_left:
            return tokens
        unit = self._blocks.tokens_per_block
        granted = tokens_left // unit * unit
        if granted == 0 and not plan.scheduled:
            granted = min(tokens, unit)  # a budget under one block still makes progress
        if 0 < granted < tokens:
            plan.chunks[request.request_id] = granted
        return granted

    def _most_tokens(self, request: R) -> int:
        """An upper bound on the tokens the request computes in the coming iteration."""
        tokens = request.step_tokens(self._blocks)
        if self._chunked and request.chunkable():
            unit = self._blocks.tokens_per_block
            tokens = min(tokens, max(unit, self._max_num_tokens // unit * unit))
        return tokens

    def _pause_until_running_fits(self, plan: Schedule[R], free: int) -> int:
        keep = list(self._running)
        position = 0
        while position < len(keep):
            request = keep[position]
            demand = request.step_block_demand(self._blocks, self._most_tokens(request))
            while demand > free and keep[-1] is not request:
                free += self._pause(keep.pop(), plan)
            if demand > free:
                free += self._pause(keep.pop(), plan)
                break
            free -= demand
            position += 1
        self._running = keep
        # back to the front of the queue, in admission order
        self._waiting.extendleft(plan.paused)
        return free

    def _pause(self, request: R, plan: Schedule[R]) -> int:
        plan.paused.append(request)
        return request.freeable_blocks(self._blocks)

    def _admit(self, plan: Schedule[R], free: int, tokens_left: int) -> None:
        if not self._waiting:
            return
        width = (self._running[0] if self._running else self._waiting[0]).beam_width
        reserved = sum(self._reserved.values())
        while self._waiting and len(self._running) < self._max_batch_size:
            request = self._waiting[0]
            if request.beam_width != width or any(request is p for p in plan.paused):
                return
            tokens = request.step_tokens(self._blocks)
            if self._chunked and request.chunkable():
                oversized = False
                tokens = self._grant(request, tokens, tokens_left, plan)
                if not tokens:
                    return
            else:
                oversized = tokens > self._max_num_tokens
                if tokens > tokens_left and not oversized:
                    return
            if self._policy is CapacitySchedulerPolicy.GUARANTEED_NO_EVICT:
                need = request.max_block_demand(self._blocks.tokens_per_block)
                if reserved + need > self._blocks.num_blocks:
                    plan.chunks.pop(request.request_id, None)
                    return
                reserved += need
                self._reserved[request.request_id] = need
            else:
                demand = request.step_block_demand(self._blocks, tokens)
                if demand > free:
                    plan.chunks.pop(request.request_id, None)
                    return
                free -= demand
            self._waiting.popleft()
            self._running.append(request)
            plan.admitted.append(request)
            if oversized:  # runs alone; the running requests wait one iteration
                plan.scheduled = [request]
                return
            plan.scheduled.append(request)
            tokens_left -= tokens
