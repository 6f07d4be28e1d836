"""Triton's response cache end to end: a server with ``--cache-config local,size=N`` and models
with ``response_cache { enable: true }``, driven with tritonclient over HTTP and gRPC. A hit is
proven by the model's execution count not moving; the statistics (HTTP and gRPC) and the
``nv_cache_*`` metrics show the hits and misses."""

from __future__ import annotations

import pathlib
import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as triton_shm
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import serving
from tests.e2e.models import identity_model, repeat_model
from tests.e2e.server import ShoalServer

CACHE_BYTES = 12_000  # two 1,000-float entries fit (4,000 bytes + ~330 of overhead each)
CACHED = "response_cache { enable: true }"


@pytest.fixture(scope="module")
def cache_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    repo = tmp_path_factory.mktemp("cache_repo")
    identity_model(repo, "cached", "FP32", extra=CACHED)
    identity_model(repo, "uncached", "FP32")
    repeat_model(repo, "decoupled_cached")
    config = repo / "decoupled_cached" / "config.pbtxt"
    config.write_text(config.read_text() + CACHED + "\n")
    identity_model(repo, "sequence_cached", "FP32", dims="[ 1 ]", max_batch_size=4,
                   extra="sequence_batching { }\n" + CACHED)
    return repo


@pytest.fixture(scope="module")
def cache_server(cache_repo: pathlib.Path) -> Iterator[ShoalServer]:
    with serving(ShoalServer([str(cache_repo)], [
            f"--cache-config=local,size={CACHE_BYTES}", "--allow-client-shm=true",
            "--model-control-mode=explicit", "--load-model=cached",
            "--load-model=uncached"])) as srv:
        yield srv


@pytest.fixture
def http(cache_server: ShoalServer) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(cache_server.url)
    yield client
    client.close()


@pytest.fixture
def grpc(cache_server: ShoalServer) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(cache_server.grpc_url)
    yield client
    client.close()


def _http_infer(client: httpclient.InferenceServerClient, model: str, data: np.ndarray,
                binary: bool = True) -> np.ndarray:
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data, binary_data=binary)
    result = client.infer(model, [tensor], outputs=[
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)])
    out: np.ndarray | None = result.as_numpy("OUTPUT0")
    assert out is not None
    return out


def _grpc_infer(client: grpcclient.InferenceServerClient, model: str,
                data: np.ndarray) -> np.ndarray:
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer(model, [tensor], outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
    out: np.ndarray | None = result.as_numpy("OUTPUT0")
    assert out is not None
    return out


def _stats(client: httpclient.InferenceServerClient, model: str) -> dict[str, Any]:
    stats: dict[str, Any] = client.get_inference_statistics(model)["model_stats"][0]
    return stats


def _figures(client: httpclient.InferenceServerClient, model: str) -> tuple[int, int, int]:
    """(execution count, cache hits, cache misses) of the model."""
    stats = _stats(client, model)
    inference = stats["inference_stats"]
    return (stats["execution_count"], inference["cache_hit"]["count"],
            inference["cache_miss"]["count"])


def _unique(n: int = 4) -> np.ndarray:
    """Input bytes no other test sends (each test's first request is a miss)."""
    return np.random.default_rng(secrets.randbits(32)).standard_normal(n).astype(np.float32)


def test_a_second_identical_request_is_a_hit_answered_without_the_worker(
        http: httpclient.InferenceServerClient) -> None:
    data = _unique()
    executions, hits, misses = _figures(http, "cached")
    np.testing.assert_array_equal(_http_infer(http, "cached", data), data)
    assert _figures(http, "cached") == (executions + 1, hits, misses + 1)
    np.testing.assert_array_equal(_http_infer(http, "cached", data), data)
    assert _figures(http, "cached") == (executions + 1, hits + 1, misses + 1)
    # the same entry answers JSON outputs too (binary_data is how, not what)
    np.testing.assert_array_equal(_http_infer(http, "cached", data, binary=False), data)
    assert _figures(http, "cached") == (executions + 1, hits + 2, misses + 1)


def test_a_hit_counts_as_a_success_with_its_duration_but_not_as_an_inference(
        http: httpclient.InferenceServerClient) -> None:
    data = _unique()
    _http_infer(http, "cached", data)
    before = _stats(http, "cached")
    _http_infer(http, "cached", data)
    after = _stats(http, "cached")
    inference = after["inference_stats"]
    assert inference["success"]["count"] == before["inference_stats"]["success"]["count"] + 1
    assert inference["cache_hit"]["ns"] > before["inference_stats"]["cache_hit"]["ns"]
    assert inference["cache_miss"]["ns"] > 0
    assert after["inference_count"] == before["inference_count"]


def test_grpc_shares_the_cache_and_its_statistics_show_hits_and_misses(
        http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient) -> None:
    data = _unique()
    executions, hits, misses = _figures(http, "cached")
    np.testing.assert_array_equal(_http_infer(http, "cached", data), data)
    np.testing.assert_array_equal(_grpc_infer(grpc, "cached", data), data)
    np.testing.assert_array_equal(_grpc_infer(grpc, "cached", data), data)
    assert _figures(http, "cached") == (executions + 1, hits + 2, misses + 1)
    stats = grpc.get_inference_statistics("cached", as_json=True)["model_stats"][0]
    inference = stats["inference_stats"]
    assert int(inference["cache_hit"]["count"]) == hits + 2
    assert int(inference["cache_miss"]["count"]) == misses + 1
    assert int(stats["execution_count"]) == executions + 1


def test_different_input_bytes_miss(http: httpclient.InferenceServerClient) -> None:
    first, second = _unique(), _unique()
    executions, hits, misses = _figures(http, "cached")
    np.testing.assert_array_equal(_http_infer(http, "cached", first), first)
    np.testing.assert_array_equal(_http_infer(http, "cached", second), second)
    longer = np.concatenate([first, first])
    np.testing.assert_array_equal(_http_infer(http, "cached", longer), longer)
    assert _figures(http, "cached") == (executions + 3, hits, misses + 3)


def test_a_model_without_response_cache_is_never_cached(
        http: httpclient.InferenceServerClient) -> None:
    data = _unique()
    executions, hits, misses = _figures(http, "uncached")
    for _ in range(3):
        np.testing.assert_array_equal(_http_infer(http, "uncached", data), data)
    assert _figures(http, "uncached") == (executions + 3, 0, 0)
    assert (hits, misses) == (0, 0)


def test_least_recently_used_entries_are_evicted_when_the_size_is_exceeded(
        http: httpclient.InferenceServerClient) -> None:
    a, b, c = _unique(1000), _unique(1000), _unique(1000)  # ~4.3 kB each, the cache holds 2
    for data in (a, b, c):
        _http_infer(http, "cached", data)
    executions, hits, misses = _figures(http, "cached")
    _http_infer(http, "cached", c)  # still there
    assert _figures(http, "cached") == (executions, hits + 1, misses)
    _http_infer(http, "cached", a)  # evicted when c came in: runs again
    assert _figures(http, "cached") == (executions + 1, hits + 1, misses + 1)


def test_an_answer_larger_than_the_cache_is_never_stored(
        http: httpclient.InferenceServerClient) -> None:
    huge = _unique(CACHE_BYTES // 4 + 1)
    executions, hits, misses = _figures(http, "cached")
    for _ in range(2):
        np.testing.assert_array_equal(_http_infer(http, "cached", huge), huge)
    assert _figures(http, "cached") == (executions + 2, hits, misses + 2)


def test_a_hit_writes_into_the_clients_shared_memory_output_region(
        http: httpclient.InferenceServerClient) -> None:
    data = _unique()
    key = f"/shmtest-cache-{secrets.token_hex(6)}"
    region = triton_shm.create_shared_memory_region("cache_out", key, 64)
    try:
        http.register_system_shared_memory("cache_out", key, 64)
        executions, hits, misses = _figures(http, "cached")
        for offset in (0, 32):  # a miss written by the worker, then a hit written by the cache
            tensor = httpclient.InferInput("INPUT0", [4], "FP32")
            tensor.set_data_from_numpy(data)
            output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
            output.set_shared_memory("cache_out", 16, offset=offset)
            result = http.infer("cached", [tensor], outputs=[output])
            assert result.get_output("OUTPUT0")["shape"] == [4]
            got = triton_shm.get_contents_as_numpy(region, np.float32, [4], offset=offset)
            np.testing.assert_array_equal(got, data)
        assert _figures(http, "cached") == (executions + 1, hits + 1, misses + 1)
        # the entry the shm requests made answers a plain request too (same key)
        np.testing.assert_array_equal(_http_infer(http, "cached", data), data)
        assert _figures(http, "cached") == (executions + 1, hits + 2, misses + 1)
    finally:
        http.unregister_system_shared_memory("cache_out")
        triton_shm.destroy_shared_memory_region(region)


def test_metrics_show_the_cache_figures_per_model(
        cache_server: ShoalServer, http: httpclient.InferenceServerClient) -> None:
    data = _unique()
    _http_infer(http, "cached", data)
    _http_infer(http, "cached", data)
    _, hits, misses = _figures(http, "cached")
    text = httpx.get(f"http://127.0.0.1:{cache_server.metrics_port}/metrics").text
    labels = '{model="cached",version="1"}'
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
              for line in text.splitlines() if line.startswith("nv_cache_")}
    assert values[f"nv_cache_num_hits_per_model{labels}"] == hits
    assert values[f"nv_cache_num_misses_per_model{labels}"] == misses
    assert values[f"nv_cache_hit_duration_per_model{labels}"] > 0
    assert values[f"nv_cache_miss_duration_per_model{labels}"] > 0
    assert not any('model="uncached"' in key for key in values)


def test_a_reload_does_not_answer_from_the_entries_of_the_model_it_replaced(
        http: httpclient.InferenceServerClient) -> None:
    data = _unique()
    _http_infer(http, "cached", data)
    _http_infer(http, "cached", data)  # a hit
    http.load_model("cached")  # a reload: new instances (statistics start afresh)
    executions, hits, misses = _figures(http, "cached")
    np.testing.assert_array_equal(_http_infer(http, "cached", data), data)
    assert _figures(http, "cached") == (executions + 1, hits, misses + 1)
    np.testing.assert_array_equal(_http_infer(http, "cached", data), data)
    assert _figures(http, "cached") == (executions + 1, hits + 1, misses + 1)


@pytest.mark.parametrize(("model", "message"), [
    ("decoupled_cached", "the response cache does not support decoupled models"),
    ("sequence_cached", "the response cache does not support sequence batching"),
])
def test_decoupled_and_sequence_models_with_the_cache_are_refused_at_load(
        http: httpclient.InferenceServerClient, model: str, message: str) -> None:
    with pytest.raises(InferenceServerException, match=message):
        http.load_model(model)
    assert not http.is_model_ready(model)


def test_without_a_server_cache_the_model_serves_uncached(
        cache_repo: pathlib.Path) -> None:
    with serving(ShoalServer([str(cache_repo)], [
            "--model-control-mode=explicit", "--load-model=cached"])) as srv:
        client = httpclient.InferenceServerClient(srv.url)
        data = _unique()
        for _ in range(2):
            np.testing.assert_array_equal(_http_infer(client, "cached", data), data)
        assert _figures(client, "cached") == (2, 0, 0)
        metrics = httpx.get(f"http://127.0.0.1:{srv.metrics_port}/metrics").text
        assert "nv_cache_" not in metrics
        assert "model 'cached' enables response_cache but the server has no cache" in srv.log()
        client.close()


def test_with_several_frontends_each_caches_and_the_statistics_sum_them(
        cache_repo: pathlib.Path) -> None:
    """--http-workers 2: each frontend process has its own cache, so a body repeated over new
    connections misses at most once per frontend; the broker sums both frontends' figures
    (the other frontend's within a second)."""
    with serving(ShoalServer([str(cache_repo)], [
            "--http-workers=2", "--cache-config=local,size=1048576",
            "--model-control-mode=explicit", "--load-model=cached"])) as srv:
        body = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32",
                            "data": [1.0, 2.0, 3.0, 4.0]}]}
        for _ in range(24):  # a new connection each: SO_REUSEPORT spreads them
            with httpx.Client() as client:
                answer = client.post(f"{srv.base}/v2/models/cached/infer", json=body)
                assert answer.json()["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.0]
        time.sleep(1.5)  # the other frontend reports within a second
        client = httpclient.InferenceServerClient(srv.url)
        executions, hits, misses = _figures(client, "cached")
        client.close()
        assert hits + misses == 24
        assert 1 <= misses <= 2 and executions == misses
