"""The broker's waiting /metrics scrapes: answered on the last worker's reply, on a worker's
death, or on the deadline, whichever comes first."""

from __future__ import annotations

from shoal.broker.metrics_scrape import MetricsScrapes


def test_a_scrape_is_done_when_its_last_worker_answers() -> None:
    scrapes = MetricsScrapes(wait_s=0.25)
    token, scrape = scrapes.start(b"f0", 7, ["w1", "w2"], now=10.0)
    assert scrape.waiting == {"w1", "w2"}
    assert scrapes.answered(token, "w1") is None
    assert scrapes.answered(token, "w2") is scrape
    assert scrapes.answered(token, "w2") is None  # once only
    assert scrapes.next_deadline() is None


def test_a_scrape_without_workers_is_done_at_once() -> None:
    scrapes = MetricsScrapes()
    _, scrape = scrapes.start(b"f0", 1, [], now=0.0)
    assert not scrape.waiting
    assert scrapes.next_deadline() is None


def test_a_dead_worker_is_not_waited_for() -> None:
    scrapes = MetricsScrapes()
    token, scrape = scrapes.start(b"f0", 1, ["w1", "w2"], now=0.0)
    scrapes.answered(token, "w1")
    assert scrapes.worker_gone("w2") == [scrape]
    assert scrapes.worker_gone("w2") == []


def test_a_slow_worker_leaves_its_scrape_to_the_deadline() -> None:
    scrapes = MetricsScrapes(wait_s=0.25)
    token, scrape = scrapes.start(b"f0", 1, ["w1"], now=5.0)
    later, _ = scrapes.start(b"f1", 2, ["w1"], now=5.1)
    assert scrapes.next_deadline() == 5.25
    assert scrapes.expired(5.2) == []
    assert scrapes.expired(5.25) == [scrape]
    assert scrapes.answered(token, "w1") is None  # its late answer finds nothing waiting
    assert scrapes.answered(later, "w1") is not None
