"""The worker output budget (``shoal/workers/output_limit.OutputBudget``), clock passed in."""

from __future__ import annotations

from shoal.workers.output_limit import OutputBudget


def test_output_within_the_burst_passes_whole() -> None:
    budget = OutputBudget("model m instance m_0", rate=10, burst=100)
    assert budget.admit(b"a" * 99 + b"\n", 0.0) == b"a" * 99 + b"\n"
    assert budget.dropped == 0
    assert budget.note(100.0) == b""


def test_output_past_the_bucket_is_dropped_in_whole_lines() -> None:
    budget = OutputBudget("model m instance m_0", rate=10, burst=20)
    assert budget.admit(b"0123456789\n0123456789\nabc", 0.0) == b"0123456789\n"
    assert budget.dropped == 14
    # the cut line is dropped to its end, even once tokens are back
    assert budget.admit(b"def\nok\n", 10.0) == b"ok\n"
    assert budget.dropped == 18


def test_drops_are_noted_at_most_every_interval_and_at_the_end() -> None:
    budget = OutputBudget("model m\n instance m_0", rate=1, burst=1)
    budget.admit(b"xxxxx\n", 1.0)
    assert budget.note(2.0) == b""  # within the interval of the start
    note = budget.note(10.0)
    assert note.startswith(b"shoal: 6 bytes of output from model m\\x0a instance m_0 dropped")
    assert budget.dropped == 0
    budget.admit(b"yy\n", 11.0)
    assert budget.note(11.0) == b""
    assert budget.note(11.0, final=True).startswith(b"shoal: 3 bytes")
