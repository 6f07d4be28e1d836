"""The broker's held lease releases (broker/held_releases.py): an executing worker's releases
wait for its next Batch, an idle worker's for the end of the pass, a dead worker's are dropped."""

from __future__ import annotations

from shoal.broker.held_releases import HeldReleases, Hold
from shoal.messages import Lease


def leases(instance: str, *ids: int) -> list[Lease]:
    return [Lease(instance, i) for i in ids]


def test_releases_for_a_busy_worker_ride_on_its_next_batch() -> None:
    held = HeldReleases()
    held.add("w1", leases("w1", 1, 2), Hold.UNTIL_BATCH)
    held.add("w1", leases("w1", 3), Hold.UNTIL_BATCH)
    assert held.due(lambda instance: Hold.UNTIL_BATCH) == []  # still executing: nothing sent
    assert held.take("w1") == leases("w1", 1, 2, 3)  # in arrival order, all of them
    assert held.take("w1") == []
    assert not held


def test_a_worker_that_became_idle_gets_them_at_the_end_of_the_pass() -> None:
    held = HeldReleases()
    held.add("w1", leases("w1", 1), Hold.UNTIL_BATCH)
    held.add("w2", leases("w2", 7), Hold.UNTIL_BATCH)
    states = {"w1": Hold.UNTIL_PASS_END, "w2": Hold.UNTIL_BATCH}
    assert held.due(states.__getitem__) == [("w1", leases("w1", 1))]
    assert held.held_for("w1") == 0
    assert held.held_for("w2") == 1  # w2 still executing
    states["w2"] = Hold.UNTIL_PASS_END
    assert held.due(states.__getitem__) == [("w2", leases("w2", 7))]
    assert not held


def test_an_idle_workers_releases_wait_only_for_the_end_of_the_pass() -> None:
    held = HeldReleases()
    held.add("w1", leases("w1", 1), Hold.UNTIL_PASS_END)
    assert held.take("w1") == leases("w1", 1)  # a Batch of the same pass took them
    held.add("w1", leases("w1", 2), Hold.UNTIL_PASS_END)
    assert held.due(lambda instance: Hold.UNTIL_PASS_END) == [("w1", leases("w1", 2))]
    assert held.due(lambda instance: Hold.UNTIL_PASS_END) == []  # sent once


def test_a_dead_workers_releases_are_dropped() -> None:
    held = HeldReleases()
    held.add("gone", leases("gone", 1), Hold.DROP)
    assert not held  # never held
    held.add("w1", leases("w1", 1, 2), Hold.UNTIL_BATCH)
    assert held.due(lambda instance: Hold.DROP) == []  # it died while they were held
    assert not held
    held.add("w2", leases("w2", 3), Hold.UNTIL_BATCH)
    assert held.drop("w2") == 1  # the broker saw its exit
    assert held.drop("w2") == 0
    assert held.take("w2") == []


def test_workers_are_held_apart() -> None:
    held = HeldReleases()
    held.add("w1", leases("w1", 1), Hold.UNTIL_BATCH)
    held.add("w2", leases("w2", 1), Hold.UNTIL_BATCH)
    assert held.take("w2") == leases("w2", 1)
    assert held.held_for("w1") == 1
    held.add("w3", [], Hold.UNTIL_BATCH)  # nothing to hold
    assert held.held_for("w3") == 0
    assert held.due(lambda instance: Hold.UNTIL_PASS_END) == [("w1", leases("w1", 1))]
