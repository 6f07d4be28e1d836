"""Differential tests: the same requests to the real tritonserver 2.51 and to shoal, over the same
python-model repository; every difference fails unless tests/conformance/deliberate.py lists it.

The module runs its cases in order against one pair of servers: HTTP cases, then gRPC cases,
then the statistics and metrics the traffic left (counts, not timings). A case's answer is its
status (or gRPC code), media type and parsed body (tests/conformance/answers.py)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest

from tests.conformance import grpc_cases, http_cases
from tests.conformance.answers import http_answer
from tests.conformance.conftest import Pair
from tests.conformance.deliberate import DIFFERENCES, Answer, Difference
from tests.conformance.uncounted import discount_metrics, discount_stats, note_sent

# keys of the listed differences that some case needed: each must be needed at least once
_NEEDED: set[str] = set()
_RAN: list[str] = []

# differences found and not yet fixed nor accepted (issue #24 stays open on them): each is a
# strict xfail, so the day it is fixed the test fails until it leaves this list
KNOWN_OPEN = {
}


def _mark_known_open(request: pytest.FixtureRequest, case_key: str) -> None:
    if case_key in KNOWN_OPEN:
        request.applymarker(pytest.mark.xfail(strict=True, reason=KNOWN_OPEN[case_key]))


def _listed(case_key: str) -> list[Difference]:
    return [d for d in DIFFERENCES if any(fnmatch.fnmatchcase(case_key, p) for p in d.cases)]


def assert_same(case_key: str, triton: Answer, shoal: Answer) -> None:
    """Triton's and shoal's answers are equal once the listed differences that hold for this
    case are masked; a difference listed for exactly this case must still be there."""
    _RAN.append(case_key)
    listed = _listed(case_key)
    if triton == shoal:
        exact = [d.key for d in listed if case_key in d.cases]
        assert not exact, f"{case_key}: listed as different ({exact}) but both answer the same"
        return
    applied = []
    for difference in listed:
        if difference.triton(triton) and difference.shoal(shoal):
            triton, shoal = difference.mask(triton), difference.mask(shoal)
            applied.append(difference.key)
            _NEEDED.add(difference.key)
    assert triton == shoal, (
        f"{case_key}: shoal answers differently from Triton 2.51"
        f"{f' (after the listed differences {applied})' if applied else ''}\n"
        f"  triton: {triton}\n  shoal:  {shoal}")


@pytest.fixture(scope="module")
def http_client(pair: Pair) -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def channels(pair: Pair) -> Iterator[tuple[grpc.Channel, grpc.Channel]]:
    triton = grpc.insecure_channel(pair.triton.grpc_url)
    shoal = grpc.insecure_channel(pair.shoal.grpc_url)
    yield triton, shoal
    triton.close()
    shoal.close()


def _send(client: httpx.Client, base: str, case: http_cases.HttpCase) -> Answer:
    response = client.request(case.method, base + case.path, content=case.body,
                              headers=dict(case.headers))
    return http_answer(response)


@pytest.mark.parametrize("case", http_cases.all_cases(), ids=lambda c: c.id)
def test_http(case: http_cases.HttpCase, pair: Pair, http_client: httpx.Client,
              request: pytest.FixtureRequest) -> None:
    _mark_known_open(request, f"http:{case.id}")
    triton = discount_stats(_send(http_client, pair.triton.base, case))
    shoal = _send(http_client, pair.shoal.base, case)
    note_sent(f"http:{case.id}")
    assert_same(f"http:{case.id}", triton, shoal)


@pytest.mark.parametrize("case", grpc_cases.all_cases(), ids=lambda c: c.id)
def test_grpc(case: grpc_cases.GrpcCase, channels: tuple[grpc.Channel, grpc.Channel],
              request: pytest.FixtureRequest) -> None:
    _mark_known_open(request, f"grpc:{case.id}")
    answer = grpc_cases.stream_answer if case.stream else grpc_cases.grpc_answer
    triton, shoal = (answer(channel, case) for channel in channels)
    note_sent(f"grpc:{case.id}")
    assert_same(f"grpc:{case.id}", discount_stats(triton), shoal)


# the per-model counters Triton exports: after the same traffic both must read the same
_COUNTERS = ("nv_inference_request_success", "nv_inference_request_failure",
             "nv_inference_count", "nv_inference_exec_count",
             "nv_inference_pending_request_count")
_SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        labels = frozenset(_LABEL.findall(match.group(2) or ""))
        samples[(match.group(1), labels)] = float(match.group(3))
    return samples


def test_metric_counts_after_the_same_traffic(pair: Pair) -> None:
    triton = discount_metrics(
        metric_samples(httpx.get(pair.triton.metrics_url, timeout=10).text))
    shoal = metric_samples(
        httpx.get(f"http://127.0.0.1:{pair.shoal.metrics_port}/metrics", timeout=10).text)
    families = {name for name, _ in triton}
    missing = sorted(families - {name for name, _ in shoal})
    assert not missing, f"metric families Triton exports and shoal does not: {missing}"
    differing: dict[str, Any] = {}
    for key, value in triton.items():
        if key[0] in _COUNTERS and shoal.get(key) != value:
            differing[f"{key[0]}{dict(sorted(key[1]))}"] = (value, shoal.get(key))
    assert not differing, f"counters differ (triton, shoal): {differing}"


def test_every_listed_difference_is_seen() -> None:
    """Runs last: a listed difference no case needed is stale and must leave the table."""
    total = len(http_cases.all_cases()) + len(grpc_cases.all_cases())
    if len(_RAN) < total:
        pytest.skip(f"only {len(_RAN)} of {total} cases ran (a -k selection)")
    mine = [d for d in DIFFERENCES if any(p.startswith(("http:", "grpc:")) for p in d.cases)]
    unseen = sorted(d.key for d in mine if d.key not in _NEEDED)
    assert not unseen, f"listed differences no case showed: {unseen}"
