"""The chaos soak's 20-second version (the soaks themselves are benchmarks: ``make bench-chaos``
runs 30 minutes, ``python -m bench.chaos_soak --minutes 2 --no-write`` the 2-minute one this test
used to be): 32 clients mixing HTTP JSON, HTTP binary, gRPC, system shared memory and gRPC
streams while workers are SIGKILLed or SIGSTOPped every ~3 s and a model is reloaded every 8 s.
Every request gets exactly one answer, none comes after its deadline, every success is correct,
the long-lived processes' RSS and the server's /dev/shm stay flat, and nothing survives the
stop."""

from __future__ import annotations

import pytest

from bench.chaos_soak import render, run_soak

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_chaos_for_20_seconds() -> None:
    report = run_soak(minutes=1 / 3, clients=32, chaos_every_s=3.0, reload_every_s=8.0)
    text = render(report, "tests/e2e/test_chaos_soak.py")
    tally = report.tally
    assert not tally.violations, text
    assert set(tally.answers) == {1}, text  # exactly one answer per request
    assert sum(tally.answers.values()) > 400, text
    # the gaps are random (1.5 to 4.5 s) and a reload holds the chaos loop while it loads
    assert report.actions["reload"] >= 2 and report.actions["SIGKILL"] + \
        report.actions["SIGSTOP"] >= 4, text
    assert report.exit_code == 0 and not report.orphans, text
    assert report.shm_end <= report.shm_start + 16 * 2**20, text  # one segment of slack
    for role in ("broker", "frontend", "supervisor"):
        assert report.rss_end[role] < report.rss_start[role] * 1.25 + 16, text
