"""The dashboard's routes over a sampler: the page and its script, the latest document,
the history and its ``seconds`` parameter (bad values are a 400 naming the field)."""

from __future__ import annotations

import asyncio
import pathlib

import orjson
import psutil
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from shoal.ops.dashboard import dashboard_routes, parse_seconds
from shoal.ops.sampler import Sampler
from tests.ops.test_sampler import ID, StubDataPlane


@pytest.fixture
def sampler(tmp_path: pathlib.Path) -> Sampler:
    return Sampler(StubDataPlane(served=5), ID, root=psutil.Process(),  # type: ignore[arg-type]
                   shm_directory=str(tmp_path))


def client(sampler: Sampler) -> TestClient:
    return TestClient(Starlette(routes=dashboard_routes(sampler)))


def test_page_and_script_are_served_with_a_strict_policy(sampler: Sampler) -> None:
    http = client(sampler)
    for path in ("/dashboard", "/dashboard/"):
        page = http.get(path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert '<script src="/dashboard/dashboard.js">' in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
    script = http.get("/dashboard/dashboard.js")
    assert script.status_code == 200 and "EventSource" in script.text
    assert script.headers["content-type"].startswith("text/javascript")


def test_stats_before_the_first_sample_is_503_json(sampler: Sampler) -> None:
    reply = client(sampler).get("/dashboard/api/stats")
    assert reply.status_code == 503 and "no sample yet" in reply.json()["error"]


def test_stats_and_history_hand_out_the_sampler_documents(sampler: Sampler) -> None:
    asyncio.run(sampler.sample())
    http = client(sampler)
    stats = http.get("/dashboard/api/stats")
    assert stats.status_code == 200 and stats.content == sampler.latest_json
    assert stats.headers["cache-control"] == "no-store"
    assert stats.json()["models"][0]["name"] == "m"
    history = http.get("/dashboard/api/history")
    assert history.status_code == 200 and len(orjson.loads(history.content)["time"]) == 1
    assert http.get("/dashboard/api/history?seconds=60").status_code == 200


@pytest.mark.parametrize("value", ["abc", "0", "601", "-5", "1.5", ""])
def test_bad_seconds_is_400_naming_the_field(sampler: Sampler, value: str) -> None:
    reply = client(sampler).get(f"/dashboard/api/history?seconds={value}")
    assert reply.status_code == 400
    assert reply.json()["error"].startswith("seconds: expected an integer from 1 to 600")


def test_parse_seconds() -> None:
    assert parse_seconds(None) is None
    assert parse_seconds("600") == 600.0
    with pytest.raises(ValueError, match="got 'x'"):
        parse_seconds("x")
