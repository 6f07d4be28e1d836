"""The metrics port end to end: latency histogram and summaries after real requests, a python
model's custom metrics (and their end when it unloads), 404s, and counts that cover every
frontend with ``--http-workers 2``."""

from __future__ import annotations

import contextlib
import math
import pathlib
import socket
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.e2e.conftest import serving
from tests.e2e.metrics_models import build_metrics_repository
from tests.e2e.server import ShoalServer

IDENTITY_REQUESTS = 12
STREAMS = 3


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return build_metrics_repository(tmp_path_factory.mktemp("metrics_repo"))


@pytest.fixture(scope="module")
def server(repo: pathlib.Path) -> Iterator[ShoalServer]:
    args = ["--model-control-mode=explicit", "--load-model=identity",
            "--load-model=repeat_decoupled", "--load-model=counting", "--load-model=self_scraping",
            "--metrics-config=histogram_latencies=true", "--metrics-config=summary_latencies=true",
            "--metrics-config=summary_quantiles=0.5:0.05,0.99:0.001",
            "--metrics-interval-ms=200"]
    with serving(ShoalServer([str(repo)], args)) as srv:
        yield srv


def scrape(server: ShoalServer) -> dict[str, list[Sample]]:
    r = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics")
    assert r.status_code == 200
    return {f.name: f.samples for f in text_string_to_metric_families(r.text)}


def value(samples: list[Sample], name: str, **labels: str) -> float:
    found = [s.value for s in samples if s.name == name and all(
        s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, samples)
    return found[0]


def infer_identity(client: httpx.Client, x: float) -> None:
    r = client.post("/v2/models/identity/infer", json={"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [x]}]})
    assert r.status_code == 200, r.text


def test_histogram_and_summaries_after_requests(server: ShoalServer) -> None:
    time.sleep(0.5)  # the poller's first readings come before the requests: they are in window
    with httpx.Client(base_url=server.base) as client:
        for i in range(IDENTITY_REQUESTS):
            infer_identity(client, float(i))
        for _ in range(STREAMS):
            r = client.post("/v2/models/repeat_decoupled/generate_stream",
                            json={"IN": 2, "DELAY": 0.01})
            assert r.status_code == 200
    families = scrape(server)
    labels = {"model": "identity", "version": "1"}
    summary = families["nv_inference_request_summary_us"]
    count = value(summary, "nv_inference_request_summary_us_count", **labels)
    assert count == IDENTITY_REQUESTS
    assert count == value(families["nv_inference_request_success"],
                          "nv_inference_request_success_total", **labels)
    p50 = value(summary, "nv_inference_request_summary_us", quantile="0.5", **labels)
    p99 = value(summary, "nv_inference_request_summary_us", quantile="0.99", **labels)
    assert 0 < p50 <= p99 < 10_000_000  # µs, real durations
    total_us = value(summary, "nv_inference_request_summary_us_sum", **labels)
    assert total_us == pytest.approx(value(
        families["nv_inference_request_duration_us"],
        "nv_inference_request_duration_us_total", **labels), abs=1.0)
    for name in ("queue", "compute_input", "compute_infer", "compute_output"):
        family = families[f"nv_inference_{name}_summary_us"]
        assert value(family, f"nv_inference_{name}_summary_us_count", **labels) == \
            IDENTITY_REQUESTS
    first = families["nv_inference_first_response_histogram_ms"]
    stream = {"model": "repeat_decoupled", "version": "1"}
    assert {s.labels["model"] for s in first} == {"repeat_decoupled"}  # decoupled only
    buckets = [(s.labels["le"], s.value) for s in first
               if s.name.endswith("_bucket") and s.labels["model"] == "repeat_decoupled"]
    assert [le for le, _ in buckets] == ["100", "500", "2000", "5000", "+Inf"]  # as Triton
    counts = [c for _, c in buckets]
    assert counts == sorted(counts) and counts[-1] == STREAMS
    assert value(first, "nv_inference_first_response_histogram_ms_count", **stream) == STREAMS
    assert 0 < value(first, "nv_inference_first_response_histogram_ms_sum", **stream) < 5000 * 3


def test_custom_metrics_of_a_python_model(server: ShoalServer) -> None:
    labels = {"model": "counting", "version": "1"}
    with httpx.Client(base_url=server.base) as client:
        seen = []
        for x in (0.5, 5.0, 50.0, 500.0):
            r = client.post("/v2/models/counting/infer", json={"inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [x]}]})
            assert r.status_code == 200, r.text
            seen.append(r.json()["outputs"][0]["data"][0])
    assert seen == [1.0, 2.0, 3.0, 4.0]  # value() read in the model
    families = scrape(server)  # at once: a scrape asks the workers for their values now
    assert value(families["model_requests_seen"], "model_requests_seen_total", **labels) == 4
    assert value(families["model_last_batch"], "model_last_batch", **labels) == 1
    histogram = families["model_input_value"]
    buckets = {s.labels["le"]: s.value for s in histogram if s.name.endswith("_bucket")}
    assert buckets == {"1": 1, "10": 2, "100": 3, "+Inf": 4}
    assert value(histogram, "model_input_value_sum", **labels) == 555.5

    r = httpx.post(f"{server.base}/v2/repository/models/counting/unload")
    assert r.status_code == 200
    deadline = time.monotonic() + 10
    while "model_requests_seen" in scrape(server):  # a worker's metrics go with it
        assert time.monotonic() < deadline
        time.sleep(0.2)


@pytest.mark.parametrize("x", [3.0, 7.5])
def test_a_model_reads_back_a_metric_it_set_in_the_same_execute(server: ShoalServer,
                                                                 x: float) -> None:
    metrics_url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    r = httpx.post(f"{server.base}/v2/models/self_scraping/infer", timeout=30, json={
        "parameters": {"metrics_url": metrics_url},
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [x]}]})
    assert r.status_code == 200, r.text
    text = r.json()["outputs"][0]["data"][0]
    families = {f.name: f.samples for f in text_string_to_metric_families(text)}
    assert value(families["model_self_scraped"], "model_self_scraped",
                 model="self_scraping") == x


def test_unknown_paths_are_404_and_a_wrong_method_405(server: ShoalServer) -> None:
    base = f"http://127.0.0.1:{server.metrics_port}"
    for path in ("/", "/nope", "/metrics/x"):
        r = httpx.get(base + path)
        assert (r.status_code, r.json()) == (404, {"error": "Not Found"}), path
    r = httpx.post(base + "/metrics")
    assert (r.status_code, r.json()) == (405, {"error": "Method Not Allowed"})


def _serving_frontend(sock: socket.socket, frontends: list[psutil.Process]) -> int | None:
    """The pid of the frontend holding the server side of the connection ``sock``."""
    local_port = sock.getsockname()[1]
    for process in frontends:
        with contextlib.suppress(psutil.Error):
            for conn in process.net_connections(kind="tcp"):
                if conn.raddr and conn.raddr.port == local_port:
                    return process.pid
    return None


def _infer_on_new_connection(server: ShoalServer) -> socket.socket:
    body = (b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":[1.0]}]}')
    sock = socket.create_connection(("127.0.0.1", server.http_port))
    sock.sendall(b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    return sock


def test_counts_cover_every_frontend(repo: pathlib.Path) -> None:
    args = ["--model-control-mode=explicit", "--load-model=identity", "--http-workers=2"]
    with serving(ShoalServer([str(repo)], args)) as srv:
        frontends = [psutil.Process(pid) for pid in srv.frontend_pids()]
        assert len(frontends) == 2
        served: dict[int, int] = {p.pid: 0 for p in frontends}
        sent = 0
        while sent < 200 and (min(served.values()) < 3 or sent < 20):
            with contextlib.closing(_infer_on_new_connection(srv)) as sock:
                pid = _serving_frontend(sock, frontends)
            sent += 1
            if pid is not None:
                served[pid] += 1
        assert min(served.values()) >= 3, served  # SO_REUSEPORT spread the connections
        families = scrape(srv)
        labels = {"model": "identity", "version": "1"}
        assert value(families["nv_inference_request_success"],
                     "nv_inference_request_success_total", **labels) == sent
        assert value(families["nv_inference_count"], "nv_inference_count_total",
                     **labels) == sent
        assert not math.isnan(value(families["nv_inference_request_duration_us"],
                                    "nv_inference_request_duration_us_total", **labels))
