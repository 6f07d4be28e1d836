"""The scheduler as a pure state machine: hand-built requests, no model, no clock."""

from __future__ import annotations

from dataclasses import dataclass

from shoal.llm.config import BatchingType, CapacitySchedulerPolicy
from shoal.llm.kv_cache import BlockManager
from shoal.llm.scheduler import Scheduler

NO_EVICT = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
MAX_UTIL = CapacitySchedulerPolicy.MAX_UTILIZATION


@dataclass(eq=False)
class Fake:
    request_id: int
    beam_width: int = 1
    tokens: int = 1  # tokens of its next iteration
    demand: int = 0  # free blocks its next iteration takes
    held: int = 0  # blocks freed if paused
    max_demand: int = 1  # blocks reserved under GUARANTEED_NO_EVICT

    chunk: bool = False  # a context that may be split (chunked context)

    def step_tokens(self, blocks: BlockManager) -> int:
        return self.tokens

    def chunkable(self) -> bool:
        return self.chunk

    def step_block_demand(self, blocks: BlockManager, num_tokens: int) -> int:
        return self.demand

    def freeable_blocks(self, blocks: BlockManager) -> int:
        return self.held

    def max_block_demand(self, tokens_per_block: int) -> int:
        return self.max_demand


def make(policy: CapacitySchedulerPolicy = NO_EVICT, *, blocks: int = 100,
         batching: BatchingType = BatchingType.INFLIGHT, max_batch_size: int = 8,
         max_num_tokens: int = 1000,
         chunked: bool = False) -> tuple[Scheduler[Fake], BlockManager]:
    manager = BlockManager(blocks, 4)
    scheduler: Scheduler[Fake] = Scheduler(blocks=manager, policy=policy, batching=batching,
                                           max_batch_size=max_batch_size,
                                           max_num_tokens=max_num_tokens,
                                           enable_chunked_context=chunked)
    return scheduler, manager


def use_blocks(manager: BlockManager, count: int) -> None:
    manager.prepare_write([], 0, count * manager.tokens_per_block)


def ids(requests: list[Fake]) -> list[int]:
    return [r.request_id for r in requests]


def test_new_requests_join_running_ones_at_the_next_iteration() -> None:
    scheduler, _ = make()
    first, second = Fake(1, tokens=5), Fake(2, tokens=7)
    scheduler.add(first)
    plan = scheduler.schedule()
    assert ids(plan.scheduled) == [1] and ids(plan.admitted) == [1]
    first.tokens = 1  # generation phase now
    scheduler.add(second)
    plan = scheduler.schedule()
    assert ids(plan.scheduled) == [1, 2] and ids(plan.admitted) == [2]


def test_finished_requests_leave_and_free_their_batch_slot() -> None:
    scheduler, _ = make(max_batch_size=2)
    for i in (1, 2, 3):
        scheduler.add(Fake(i))
    assert ids(scheduler.schedule().scheduled) == [1, 2]
    assert ids(scheduler.schedule().scheduled) == [1, 2]
    assert scheduler.remove(1) is not None
    plan = scheduler.schedule()
    assert ids(plan.scheduled) == [2, 3] and ids(plan.admitted) == [3]


def test_token_budget_limits_admission_without_overtaking() -> None:
    scheduler, _ = make(max_num_tokens=10)
    scheduler.add(Fake(1, tokens=6))
    scheduler.add(Fake(2, tokens=6))
    scheduler.add(Fake(3, tokens=1))
    plan = scheduler.schedule()
    assert ids(plan.scheduled) == [1]  # 2 does not fit; 3 must not overtake it
    assert ids(scheduler.waiting) == [2, 3]


def test_context_longer_than_the_token_budget_runs_alone() -> None:
    scheduler, _ = make(max_num_tokens=10)
    running = Fake(1, tokens=1)
    scheduler.add(running)
    scheduler.schedule()
    long_context = Fake(2, tokens=50)
    scheduler.add(long_context)
    plan = scheduler.schedule()
    assert ids(plan.scheduled) == [2] and ids(plan.admitted) == [2]
    assert ids(scheduler.running) == [1, 2]
    long_context.tokens = 1
    assert ids(scheduler.schedule().scheduled) == [1, 2]


def test_guaranteed_no_evict_admits_only_what_can_finish() -> None:
    scheduler, _ = make(NO_EVICT, blocks=10)
    scheduler.add(Fake(1, max_demand=6))
    scheduler.add(Fake(2, max_demand=5))
    assert ids(scheduler.schedule().scheduled) == [1]
    assert ids(scheduler.schedule().scheduled) == [1]  # still no room for 6 + 5 > 10
    scheduler.remove(1)
    plan = scheduler.schedule()
    assert ids(plan.admitted) == [2] and plan.paused == []


def test_guaranteed_no_evict_never_pauses() -> None:
    scheduler, manager = make(NO_EVICT, blocks=4)
    request = Fake(1, demand=3, max_demand=4)
    scheduler.add(request)
    scheduler.schedule()
    use_blocks(manager, 4)  # pool is full; the reservation guarantees the request anyway
    request.demand = 0
    plan = scheduler.schedule()
    assert ids(plan.scheduled) == [1] and plan.paused == []


def test_max_utilization_pauses_the_newest_requests_when_blocks_run_out() -> None:
    scheduler, manager = make(MAX_UTIL, blocks=10)
    a, b, c, d = Fake(1, demand=1), Fake(2, demand=1), Fake(3, demand=1), Fake(4, demand=1)
    for request in (a, b, c):
        scheduler.add(request)
    assert ids(scheduler.schedule().scheduled) == [1, 2, 3]
    use_blocks(manager, 9)  # one block left for three requests that each need one
    c.held = 2
    scheduler.add(d)
    plan = scheduler.schedule()
    assert ids(plan.paused) == [3]
    assert ids(plan.scheduled) == [1, 2]  # c's 2 blocks cover b; d must not overtake c
    assert ids(scheduler.waiting) == [3, 4]


def test_paused_requests_resume_first_in_admission_order() -> None:
    scheduler, manager = make(MAX_UTIL, blocks=10)
    a, b, c = Fake(1, demand=1), Fake(2, demand=1), Fake(3, demand=1)
    for request in (a, b, c):
        scheduler.add(request)
    scheduler.schedule()
    use_blocks(manager, 10)
    b.held = c.held = 1
    a.demand = 2
    plan = scheduler.schedule()
    assert ids(plan.paused) == [3, 2] and ids(plan.scheduled) == [1]
    assert ids(scheduler.waiting) == [2, 3]


def test_max_utilization_pauses_a_lone_request_that_cannot_grow() -> None:
    scheduler, manager = make(MAX_UTIL, blocks=4)
    request = Fake(1, demand=1, held=0)
    scheduler.add(request)
    scheduler.schedule()
    use_blocks(manager, 4)
    plan = scheduler.schedule()
    assert ids(plan.paused) == [1] and plan.scheduled == []
    assert ids(scheduler.waiting) == [1]


def test_max_utilization_admits_while_the_next_iteration_fits() -> None:
    scheduler, _ = make(MAX_UTIL, blocks=5)
    scheduler.add(Fake(1, demand=3, max_demand=50))
    scheduler.add(Fake(2, demand=3, max_demand=50))
    plan = scheduler.schedule()
    assert ids(plan.admitted) == [1]


def test_other_beam_width_waits_until_running_requests_drain() -> None:
    scheduler, _ = make()
    scheduler.add(Fake(1, beam_width=2))
    scheduler.schedule()
    scheduler.add(Fake(2, beam_width=1))
    scheduler.add(Fake(3, beam_width=2))
    assert ids(scheduler.schedule().scheduled) == [1]  # 2 blocks the queue, 3 cannot overtake
    scheduler.remove(1)
    plan = scheduler.schedule()
    assert ids(plan.admitted) == [2]  # width switches to 1; 3 waits for 2 to drain
    scheduler.remove(2)
    assert ids(scheduler.schedule().admitted) == [3]


def test_static_batching_forms_a_batch_only_when_the_previous_one_drained() -> None:
    scheduler, _ = make(batching=BatchingType.STATIC, max_batch_size=2)
    scheduler.add(Fake(1))
    scheduler.add(Fake(2))
    assert ids(scheduler.schedule().admitted) == [1, 2]
    scheduler.add(Fake(3))
    scheduler.remove(1)
    plan = scheduler.schedule()
    assert ids(plan.scheduled) == [2] and plan.admitted == []
    scheduler.remove(2)
    assert ids(scheduler.schedule().admitted) == [3]


def test_remove_forgets_waiting_requests_and_reservations() -> None:
    scheduler, _ = make(NO_EVICT, blocks=10)
    scheduler.add(Fake(1, max_demand=10))
    scheduler.add(Fake(2, max_demand=10))
    scheduler.schedule()
    assert scheduler.remove(2) is not None and scheduler.waiting == []
    assert scheduler.remove(1) is not None and scheduler.remove(1) is None
    scheduler.add(Fake(3, max_demand=10))
    assert ids(scheduler.schedule().admitted) == [3]


def test_chunked_context_takes_whole_blocks_of_what_generations_leave() -> None:
    scheduler, _ = make(max_num_tokens=20, chunked=True)  # blocks of 4 tokens
    gen_a, context, gen_b = Fake(1), Fake(2, tokens=50, chunk=True), Fake(3)
    for request in (gen_a, context, gen_b):
        scheduler.add(request)
    first = scheduler.schedule()
    # admission order: the context gets the 19 tokens gen_a leaves, cut to whole blocks (16);
    # gen_b fits in the 3 left
    assert ids(first.scheduled) == [1, 2, 3] and first.chunks == {2: 16}
    context.tokens = 34
    plan = scheduler.schedule()
    # running generations are served first; the chunk takes 20 - 2 = 18 -> 16 tokens
    assert ids(plan.scheduled) == [1, 3, 2] and plan.chunks == {2: 16}
    context.tokens = 18  # the last piece fits: not cut
    plan = scheduler.schedule()
    assert ids(plan.scheduled) == [1, 3, 2] and plan.chunks == {}


def test_chunk_under_one_block_only_when_nothing_else_runs() -> None:
    scheduler, _ = make(max_num_tokens=3, chunked=True)
    scheduler.add(Fake(1, tokens=10, chunk=True))
    plan = scheduler.schedule()
    assert ids(plan.scheduled) == [1] and plan.chunks == {1: 4}  # one block: progress


def test_without_chunking_a_long_context_runs_alone() -> None:
    scheduler, _ = make(max_num_tokens=20)
    generating = Fake(1)
    scheduler.add(generating)
    scheduler.schedule()
    scheduler.add(Fake(2, tokens=50, chunk=True))
    plan = scheduler.schedule()
    assert ids(plan.scheduled) == [2] and plan.chunks == {}
