"""The frontend's descriptor budget (pure), the rate-limited warning, and the RLIMIT raise."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from shoal.frontend import limits
from shoal.frontend.limits import (
    BASE_RESERVE,
    METRICS_CONNECTIONS,
    MIN_CONNECTIONS,
    OVER_CAP_CONNECTIONS,
    RateLimitedWarning,
    plan_descriptor_budget,
)
from shoal.settings import settings_from_flags

SETTINGS = settings_from_flags(model_repositories=["/m"]).for_frontends()


def test_default_caps_fit_a_common_hard_limit_unchanged() -> None:
    budget = plan_descriptor_budget(20_000, SETTINGS, serves_metrics=True)
    assert (budget.http_connections, budget.grpc_connections) == (4096, 4096)
    assert budget.reserved == BASE_RESERVE + OVER_CAP_CONNECTIONS + METRICS_CONNECTIONS
    assert budget.over_cap == OVER_CAP_CONNECTIONS and not budget.scaled


def test_a_low_limit_scales_both_caps_into_the_room_left() -> None:
    budget = plan_descriptor_budget(4096, SETTINGS, serves_metrics=False)
    assert budget.scaled
    room = 4096 - BASE_RESERVE - OVER_CAP_CONNECTIONS
    assert budget.http_connections + budget.grpc_connections <= room
    assert budget.http_connections == room // 2


def test_client_shm_regions_and_grpc_off_change_the_split() -> None:
    settings = settings_from_flags(model_repositories=["/m"], allow_client_shm=True,
                                   client_shm_max_regions=1000, allow_grpc=False).for_frontends()
    budget = plan_descriptor_budget(3000, settings, serves_metrics=False)
    assert budget.reserved == BASE_RESERVE + OVER_CAP_CONNECTIONS + 1000
    assert budget.grpc_connections == 0
    assert budget.http_connections == 3000 - budget.reserved


def test_a_tiny_limit_keeps_the_minimum() -> None:
    budget = plan_descriptor_budget(256, SETTINGS, serves_metrics=True)
    assert budget.http_connections >= MIN_CONNECTIONS
    assert budget.grpc_connections >= MIN_CONNECTIONS


def test_the_budget_is_logged_once_and_scaling_warned(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=limits.__name__)
    limits.log_descriptor_budget(1024, plan_descriptor_budget(4096, SETTINGS, False), SETTINGS)
    messages = [r.getMessage() for r in caplog.records]
    assert "limit 4096 (raised from 1024)" in messages[0]
    assert "too low for --http-max-connections=4096" in messages[1]


def test_rate_limited_warning_counts_what_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    warn = RateLimitedWarning(logging.getLogger("t"), interval_s=10, clock=lambda: now[0])
    for _ in range(5):
        warn("cap hit (%d)", 7)
    now[0] += 10
    warn("cap hit (%d)", 8)
    assert [r.getMessage() for r in caplog.records] == [
        "cap hit (7)", "cap hit (8) (4 more since the last such line)"]


def test_the_soft_descriptor_limit_is_raised_to_the_hard_limit() -> None:
    code = (
        "import resource\n"
        "from shoal.frontend.limits import raise_descriptor_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))\n"
        "before, after = raise_descriptor_limit()\n"
        "assert before == min(256, hard) and after == hard, (before, after)\n"
        "assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
