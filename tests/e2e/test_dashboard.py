"""The ops dashboard API and ``shoal top`` against a real server (two frontends, a TorchScript
model, a python model that queues and an llm-backend model), while clients infer."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psutil
import pytest

from tests.e2e.conftest import serving
from tests.e2e.models import sleepy_model
from tests.e2e.server import ShoalServer, free_port
from tests.ops.live import (
    LLM_KV_BLOCKS,
    Load,
    build_dashboard_repository,
    model_row,
    stats,
    wait_for,
)

ROLES = {"supervisor", "broker", "frontend", "worker"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = build_dashboard_repository(tmp_path_factory.mktemp("dashboard-repo"), llm=True)
    with serving(ShoalServer([str(repo)], ["--http-workers=2"])) as srv:
        yield srv


def stats_when(server: ShoalServer, condition: Callable[[dict[str, Any]], bool]
               ) -> Callable[[], dict[str, Any] | None]:
    """A probe for ``wait_for``: the latest document once ``condition`` holds for it."""
    def probe() -> dict[str, Any] | None:
        document = stats(server.metrics_port)
        return document if condition(document) else None

    return probe


def by_role(document: dict[str, Any], role: str) -> list[dict[str, Any]]:
    return [p for p in document["processes"] if p["role"] == role]


def test_the_document_shows_every_process_and_the_models_while_clients_infer(
        server: ShoalServer) -> None:
    with Load(server.base) as load:
        first = wait_for(stats_when(server, lambda d: model_row(d, "mlp")["success_count"] > 0),
                         what="mlp answers in the stats")
        time.sleep(2.5)
        later = stats(server.metrics_port)
    assert not load.failures, load.failures[:3]
    assert later["schema_version"] == 1 and later["time"] > first["time"]
    # processes: the real tree, with roles and the pids psutil sees
    assert {p["role"] for p in later["processes"]} >= ROLES
    supervisor = by_role(later, "supervisor")[0]
    assert supervisor["pid"] == server.process.pid  # type: ignore[union-attr]
    assert sorted(p["frontend_index"] for p in by_role(later, "frontend")) == [0, 1]
    assert {p["pid"] for p in by_role(later, "frontend")} == set(server.frontend_pids())
    workers = {p["model"]: p for p in by_role(later, "worker")}
    assert set(workers) == {"mlp", "sleepy", "llm"}
    assert workers["mlp"]["pid"] in server.worker_pids("mlp")
    assert workers["mlp"]["device"] == "cpu" and workers["mlp"]["instance"] == "mlp_0_0"
    for process in later["processes"]:
        assert process["rss_bytes"] > 0 and process["threads"] >= 1
        assert process["open_fds"] > 0 and process["uptime_s"] > 0
    # models: figures that move while the clients run
    mlp, sleepy = model_row(later, "mlp"), model_row(later, "sleepy")
    assert mlp["state"] == "READY" and mlp["instances"] == 1
    assert mlp["success_count"] > model_row(first, "mlp")["success_count"]
    assert mlp["requests_per_s"] > 0 and sleepy["requests_per_s"] > 0
    assert mlp["latency"]["count"] > 0 and mlp["latency"]["request_p99_us"] > 0
    assert mlp["latency"]["compute_p50_us"] > 0
    assert sum(b["executions"] for b in mlp["batch_sizes"]) > 0
    # shared memory: the frontends' input arenas and the workers' output arenas exist now
    kinds = {o["kind"] for o in later["shared_memory"]["owners"]}
    assert {"frontend input arena", "worker output arena"} <= kinds
    assert later["shared_memory"]["total_bytes"] > 0
    assert any(p["shm_bytes"] > 0 for p in by_role(later, "worker"))
    assert [row["name"] for row in later["llm"]] == ["llm"]  # served, idle: no LLM client


def llm_row(document: dict[str, Any]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = document["llm"]
    (row,) = rows
    assert row["name"] == "llm" and row["version"] == 1
    return row


def test_the_llm_row_shows_tokens_latencies_and_blocks_while_a_client_generates(
        server: ShoalServer) -> None:
    before = llm_row(stats(server.metrics_port))
    with Load(server.base, clients=0, llm_clients=2) as load:
        busy = llm_row(wait_for(stats_when(
            server, lambda d: llm_row(d)["tokens_per_s"] > 0
            and llm_row(d)["first_tokens"] > 0 and llm_row(d)["itl_p99_us"] is not None),
            what="llm tokens/s and latencies in the stats"))
        used = wait_for(stats_when(server, lambda d: llm_row(d)["kv_blocks_used"] > 0),
                        what="KV blocks in use")
    assert not load.failures, load.failures[:3]
    assert busy["generation_tokens"] > before["generation_tokens"]
    assert busy["prompt_tokens"] > before["prompt_tokens"]
    assert 0 < busy["ttft_p50_us"] <= busy["ttft_p99_us"]
    assert 0 <= busy["itl_p50_us"] <= busy["itl_p99_us"]
    assert busy["kv_blocks_max"] == LLM_KV_BLOCKS
    row = llm_row(used)
    assert row["kv_blocks_used"] + row["kv_blocks_free"] == LLM_KV_BLOCKS
    assert busy["kv_pool_bytes"] > 0 and busy["weights_bytes"] > 0
    idle = llm_row(wait_for(stats_when(server, lambda d: llm_row(d)["kv_blocks_used"] == 0
                                       and llm_row(d)["active_requests"] == 0),
                            what="the llm idle again"))
    assert idle["kv_blocks_free"] == LLM_KV_BLOCKS and idle["queued_requests"] == 0


def test_queue_depth_shows_requests_waiting_for_the_instance(server: ShoalServer) -> None:
    with Load(server.base, clients=4):
        document = wait_for(stats_when(server,
                                       lambda d: model_row(d, "sleepy")["queue_depth"] > 0),
                            what="a queue on sleepy")
    queued = model_row(document, "sleepy")
    assert queued["in_flight"] <= 1  # one instance runs one request at a time
    assert queued["latency"]["queue_p99_us"] is None or queued["latency"]["queue_p99_us"] > 0


def test_a_killed_frontend_counts_as_a_restart(server: ShoalServer) -> None:
    before = {p["frontend_index"]: p for p in by_role(stats(server.metrics_port), "frontend")}
    os.kill(before[1]["pid"], signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        now = {p["frontend_index"]: p for p in by_role(stats(server.metrics_port), "frontend")}
        one = now.get(1)
        return one if one is not None and one["pid"] != before[1]["pid"] else None

    one = wait_for(restarted, what="frontend 1 restarted")
    assert one["restarts"] == before[1]["restarts"] + 1
    zero = next(p for p in by_role(stats(server.metrics_port), "frontend")
                if p["frontend_index"] == 0)
    assert zero["restarts"] == 0 and zero["pid"] == before[0]["pid"]
    server.wait_ready()


def test_history_and_the_live_feed(server: ShoalServer) -> None:
    base = f"http://127.0.0.1:{server.metrics_port}/dashboard"
    history = httpx.get(f"{base}/api/history", timeout=10).json()
    assert len(history["time"]) >= 3
    assert {"mlp:1", "sleepy:1"} <= history["models"].keys()
    assert all(len(s["cpu_percent"]) == len(history["time"])
               for s in history["processes"].values())
    assert len(httpx.get(f"{base}/api/history?seconds=2", timeout=10).json()["time"]) <= 3
    bad = httpx.get(f"{base}/api/history?seconds=nope", timeout=10)
    assert bad.status_code == 400 and bad.json()["error"].startswith("seconds:")
    times = []
    with httpx.stream("GET", f"{base}/api/stream", timeout=10) as feed:
        assert feed.headers["content-type"].startswith("text/event-stream")
        for line in feed.iter_lines():
            if line.startswith("data: "):
                times.append(httpx.Response(200, content=line[6:]).json()["time"])
            if len(times) == 3:
                break
    assert times == sorted(times) and len(set(times)) == 3  # a new sample each event
    assert 1.0 <= times[2] - times[0] <= 8.0  # about a second apart (a loaded machine: later)


def test_the_page_is_served(server: ShoalServer) -> None:
    page = httpx.get(f"http://127.0.0.1:{server.metrics_port}/dashboard", timeout=10)
    assert page.status_code == 200 and "/dashboard/dashboard.js" in page.text
    assert httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics",
                     timeout=10).status_code == 200  # /metrics is still there


def test_an_open_live_feed_ends_cleanly_when_the_server_stops(tmp_path: pathlib.Path) -> None:
    repo = tmp_path / "repo"
    sleepy_model(repo, "sleepy")
    srv = ShoalServer([str(repo)])
    events: list[str] = []
    outcome: list[str] = []

    def follow() -> None:
        try:
            with httpx.stream("GET", f"http://127.0.0.1:{srv.metrics_port}/dashboard/api/stream",
                              timeout=60) as feed:
                for line in feed.iter_lines():
                    if line.startswith("data: "):
                        events.append(line)
            outcome.append("ended")
        except httpx.HTTPError as exc:
            outcome.append(repr(exc))

    reader = threading.Thread(target=follow, daemon=True)
    with serving(srv):  # at the block's end: SIGTERM, exit 0, nothing left behind
        wait_for(lambda: stats(srv.metrics_port) or None, what="the first sample")
        reader.start()
        wait_for(lambda: events or None, what="the first event")
        stopping = time.monotonic()
    stop_s = time.monotonic() - stopping
    reader.join(timeout=10)
    assert outcome == ["ended"]  # the server closed the feed, it was not cut
    assert stop_s < 15  # far below --exit-timeout-secs (30): the feed did not hold the drain


# ------------------------------------------------------------------ shoal top

def shoal_command() -> list[str]:
    return [sys.executable, "-m", "shoal"]


def test_top_once_prints_processes_and_models(server: ShoalServer) -> None:
    done = subprocess.run(
        [*shoal_command(), "top", "--url", f"http://127.0.0.1:{server.metrics_port}", "--once"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    for text in ("supervisor", "broker", "frontend 0", "frontend 1", "mlp v1 mlp_0_0 (cpu)",
                 "sleepy", "READY", "shared memory", "LLM", "TTFT p50/p99", "KV used"):
        assert text in done.stdout
    llm_table = done.stdout[done.stdout.index("TTFT p50/p99"):]
    assert any(line.startswith("│llm ") for line in llm_table.splitlines())  # the llm's row


def test_top_says_when_the_server_is_unreachable() -> None:
    port = free_port()
    done = subprocess.run([*shoal_command(), "top", "--url", f"http://127.0.0.1:{port}",
                           "--once"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.startswith(f"shoal top: cannot reach http://127.0.0.1:{port}")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed "
                    "(apt-get install -y tmux)")
def test_top_live_view_under_tmux(server: ShoalServer) -> None:
    socket_name = f"shoal-top-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-L", socket_name]
    # the pane's shell may export COLUMNS=80 from before the pane had its size: rich would
    # take it over the terminal's real width
    command = " ".join(["env", "-u", "COLUMNS", "-u", "LINES", *shoal_command(), "top", "--url",
                        f"http://127.0.0.1:{server.metrics_port}", "--interval", "0.5"])
    subprocess.run([*tmux, "new-session", "-d", "-s", "top", "-x", "200", "-y", "50", command],
                   check=True, timeout=30)
    socket_path = subprocess.run([*tmux, "display-message", "-p", "#{socket_path}"],
                                 capture_output=True, text=True, timeout=30).stdout.strip()
    try:
        def screen() -> str | None:
            text = subprocess.run([*tmux, "capture-pane", "-p", "-t", "top"],
                                  capture_output=True, text=True, timeout=30).stdout
            return text if "mlp v1 mlp_0" in text and "frontend 1" in text else None

        first = wait_for(screen, what="shoal top's frame in tmux")
        for text in ("shoal top", "supervisor", "broker", "frontend 0", "sleepy", "READY",
                     "LLM", "TTFT p50/p99"):
            assert text in first
        stamp = first.splitlines()[0]
        def refreshed() -> str | None:
            text = screen()
            return text if text and text.splitlines()[0] != stamp else None

        wait_for(refreshed, what="the frame to refresh")
        pane_pid = int(subprocess.run([*tmux, "display-message", "-p", "-t", "top",
                                       "#{pane_pid}"], capture_output=True, text=True,
                                      timeout=30).stdout)
        subprocess.run([*tmux, "send-keys", "-t", "top", "C-c"], check=True, timeout=30)
        psutil.Process(pane_pid).wait(timeout=10)  # Ctrl-C ends it
    finally:
        subprocess.run([*tmux, "kill-server"], timeout=30, check=False)
        if socket_path:
            pathlib.Path(socket_path).unlink(missing_ok=True)


def test_the_restricted_dashboard_needs_the_header(tmp_path: pathlib.Path) -> None:
    from shoal.settings import Settings

    if "http_restricted_apis" not in Settings.__struct_fields__:
        pytest.skip("this build has no --http-restricted-api")
    repo = tmp_path / "repo"
    build_dashboard_repository(repo)
    shutil.rmtree(repo / "mlp")
    srv = ShoalServer([str(repo)], ["--http-restricted-api=dashboard:ops-key=s3cret"])
    with serving(srv):
        url = f"http://127.0.0.1:{srv.metrics_port}"
        assert httpx.get(f"{url}/dashboard/api/stats", timeout=10).status_code == 403
        refused = subprocess.run([*shoal_command(), "top", "--url", url, "--once"],
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1 and "restricted (403" in refused.stderr
        assert "--header" in refused.stderr
        wait_for(lambda: stats(srv.metrics_port, {"ops-key": "s3cret"}) or None,
                 what="the first sample")
        allowed = subprocess.run([*shoal_command(), "top", "--url", url, "--once",
                                  "--header", "ops-key=s3cret"],
                                 capture_output=True, text=True, timeout=60,
                                 env={**os.environ, "COLUMNS": "200"})
        assert allowed.returncode == 0, allowed.stderr
        assert "sleepy" in allowed.stdout

