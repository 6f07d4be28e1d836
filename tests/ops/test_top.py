"""``shoal top``'s parts: the frame it draws from a document, sparklines, trends seeded from
the history, its flags, and the error it prints for each way a poll fails (a real local HTTP
server answers 403 / 404 / junk; a closed port refuses)."""

from __future__ import annotations

import argparse
import http.server
import io
import threading
from collections.abc import Iterator

import pytest
from rich.console import Console

from shoal.ops.schema import (
    SCHEMA_VERSION,
    BatchSizeCount,
    ClientRegionStats,
    DeviceHolderStats,
    DeviceMemoryStats,
    HistoryDocument,
    LatencySummary,
    LlmStats,
    ModelSeries,
    ModelVersionStats,
    ProcessSeries,
    ProcessStats,
    ServerInfo,
    SharedMemoryStats,
    StatsDocument,
)
from shoal.ops.top import DashboardClient, TopError, Trends, render, sparkline
from shoal.ops.top_args import add_top_arguments
from tests.e2e.server import free_port


def document(time: float = 1000.0, rps: float = 12.5, llm: bool = False) -> StatsDocument:
    process = ProcessStats(key="worker mlp:1:mlp_0_0@cpu", role="worker",
                           label="mlp v1 mlp_0_0 (cpu)", pid=42, ppid=41, cpu_percent=55.0,
                           rss_bytes=300 << 20, threads=5, open_fds=19, uptime_s=3725.0,
                           restarts=2, shm_bytes=16 << 20, model="mlp", version=1,
                           instance="mlp_0_0", device="cpu")
    model = ModelVersionStats(
        name="mlp", version=1, state="READY", reason="", platform="pytorch_libtorch",
        instances=1, queue_depth=3, in_flight=1, requests_per_s=rps, inferences_per_s=50.0,
        errors_per_s=0.0, success_count=100, fail_count=4, rejections=1,
        fail_by_reason={"REJECTED": 1, "BACKEND": 3},
        batch_sizes=[BatchSizeCount(batch_size=4, executions=10, recent=6)],
        latency=LatencySummary(window_s=10.0, count=60, request_p50_us=2150.0,
                               request_p99_us=48000.0, queue_p99_us=900.0,
                               compute_p99_us=30000.0),
        instance_restarts={"mlp_0_0": 2})
    return StatsDocument(
        schema_version=SCHEMA_VERSION, time=time, interval_s=1.0, sample_ms=9.0,
        sample_cpu_ms=3.5,
        server=ServerInfo(instance_id="abcdef012345", sampler_pid=7, sampler_started=900.0,
                          ready=True, exiting=False),
        processes=[process], models=[model],
        shared_memory=SharedMemoryStats(
            total_bytes=48 << 20, total_resident_bytes=32 << 20, owners=[],
            client_regions=[ClientRegionStats(name="in0", kind="system", key="/in0",
                                              offset=0, byte_size=4096)]),
        llm=[LlmStats(name="llama", version=1, kv_blocks_used=10, kv_blocks_free=90,
                      active_requests=2, tokens_per_s=99.0)] if llm else [],
        errors=["model statistics unavailable: no answer in time"])


def text_of(renderable: object) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(renderable)
    return out.getvalue()


def test_a_frame_shows_models_processes_memory_and_errors() -> None:
    trends = Trends()
    trends.add(document(1000.0, rps=5.0))
    trends.add(document(1001.0, rps=10.0))
    text = text_of(render(document(1001.0), trends, "http://127.0.0.1:8002"))
    for expected in ("instance abcdef012345", "ready", "sample 9.0 ms (3.5 ms CPU)",
                     "mlp v1 mlp_0_0 (cpu)", "worker", "55.0", "300.0 MiB", "1h02",
                     "2.15ms/48.0ms", "4:6", "48.0 MiB in server segments", "in0 (system /in0)",
                     "model statistics unavailable"):
        assert expected in text, expected
    row = next(line for line in text.splitlines() if line.startswith("│mlp "))
    cells = [cell.strip() for cell in row.strip("│").split("│")]
    assert cells[:7] == ["mlp", "1", "READY", "1", "3", "1", "12.5"]  # ... queue, in flight
    assert "LLM" not in text  # no panel without LLM models


def test_the_llm_table_appears_only_with_entries() -> None:
    assert "llama" in text_of(render(document(llm=True), Trends(), "u"))


def test_a_failed_poll_is_shown_over_the_last_frame() -> None:
    text = text_of(render(document(), Trends(), "u", problem="cannot reach u: refused"))
    assert "disconnected: cannot reach u: refused (retrying)" in text


def test_sparklines_scale_to_the_largest_value_with_a_floor() -> None:
    assert sparkline([0.0, 5.0, 10.0]) == "▁▄█"
    assert sparkline([0.5, 1.0], floor=10.0) == "▁▁"  # noise near zero stays low
    assert sparkline([None, 2.0]) == " █"
    assert sparkline([]) == ""


def test_trends_start_from_the_history_and_skip_a_repeated_sample() -> None:
    history = HistoryDocument(
        schema_version=SCHEMA_VERSION, interval_s=1.0, time=[998.0, 999.0],
        processes={"broker": ProcessSeries(label="broker", cpu_percent=[1.0, None],
                                           rss_bytes=[10, None])},
        models={"mlp:1": ModelSeries(label="mlp v1", requests_per_s=[0.0, 4.0],
                                     request_p99_us=[None, 1.0], queue_depth=[0, 1],
                                     in_flight=[0, 0])})
    trends = Trends()
    trends.seed(history)
    trends.add(document(999.0, rps=100.0))  # the history's last sample again: ignored
    trends.add(document(1000.0, rps=8.0))
    assert list(trends.series["rps mlp:1"]) == [0.0, 4.0, 8.0]
    assert list(trends.series["cpu broker"]) == [1.0, None]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_top_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_and_their_defaults() -> None:
    args = parse()
    assert (args.url, args.interval, args.once, args.header) == (
        "http://127.0.0.1:8002", 1.0, False, [])
    args = parse("--header", "admin-key=a=b", "--interval", "0.5", "--once")
    assert args.header == [("admin-key", "a=b")] and args.interval == 0.5 and args.once


@pytest.mark.parametrize("argv", [["--header", "novalue"], ["--interval", "0"],
                                  ["--interval", "x"]])
def test_bad_flags_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(*argv)
    assert "--header expects KEY=VALUE" in capsys.readouterr().err or "--interval" in argv[0]


class _Handler(http.server.BaseHTTPRequestHandler):
    answers: dict[str, tuple[int, bytes]] = {}
    seen_headers: list[dict[str, str]] = []

    def do_GET(self) -> None:
        self.seen_headers.append({k.lower(): v for k, v in self.headers.items()})
        status, body = self.answers.get(self.path.split("?")[0], (404, b'{"error":"Not Found"}'))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_port() -> Iterator[str]:
    """A real HTTP server on the loopback whose answers each test sets."""
    _Handler.answers, _Handler.seen_headers = {}, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_restricted_dashboard_names_the_flag(fake_port: str) -> None:
    _Handler.answers["/dashboard/api/stats"] = (
        403, b'{"error":"This API is restricted, expecting header \'admin-key\'"}')
    with pytest.raises(TopError) as raised:
        DashboardClient(fake_port, [("admin-key", "wrong")], 5).stats()
    assert "is restricted (403: This API is restricted, expecting header 'admin-key')" in str(
        raised.value)
    assert "--header KEY=VALUE" in str(raised.value)
    assert _Handler.seen_headers[0]["admin-key"] == "wrong"


def test_a_port_that_is_not_a_dashboard(fake_port: str) -> None:
    with pytest.raises(TopError, match="is this a shoal metrics port"):
        DashboardClient(fake_port, [], 5).stats()
    _Handler.answers["/dashboard/api/stats"] = (200, b'{"hello": 1}')
    with pytest.raises(TopError, match="is not a shoal dashboard document"):
        DashboardClient(fake_port, [], 5).stats()


def test_the_history_is_optional(fake_port: str) -> None:
    assert DashboardClient(fake_port, [], 5).history(40) is None


def test_an_unreachable_server() -> None:
    port = free_port()
    with pytest.raises(TopError, match=f"cannot reach http://127.0.0.1:{port}"):
        DashboardClient(f"http://127.0.0.1:{port}", [], 5).stats()


def test_the_device_ledger_lines_appear_with_devices() -> None:
    doc = document()
    doc.devices = [DeviceMemoryStats(device=0, capacity_bytes=4 << 30, limit_bytes=2 << 30,
                                     reserved_bytes=3 << 20, holders=[
                                         DeviceHolderStats(model="llm", part="kv_pool",
                                                           bytes=2 << 20)])]
    text = text_of(render(doc, Trends(), "u"))
    assert "GPU 0 ledger: 3.0 MiB reserved of 2.0 GiB (llm kv_pool 2.0 MiB)" in text
    assert "ledger" not in text_of(render(document(), Trends(), "u"))
