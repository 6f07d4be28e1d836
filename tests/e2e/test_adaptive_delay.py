"""The adaptive queue delay through the real server: a lone client stops waiting for partners
that never come, a burst still batches, and the model parameter turns it off."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.conftest import serving
from tests.e2e.models import sleepy_model
from tests.e2e.server import ShoalServer

DELAY_US = 200_000  # 200 ms: far longer than a round trip on any machine
OFF = 'parameters { key: "shoal_adaptive_queue_delay" value { string_value: "false" } }'


@pytest.fixture(scope="module")
def delay_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo: pathlib.Path = tmp_path_factory.mktemp("adaptive")
    batching = f"dynamic_batching {{ max_queue_delay_microseconds: {DELAY_US} }}"
    sleepy_model(repo, "lone", max_batch_size=8, extra=batching)
    sleepy_model(repo, "burst", max_batch_size=8, extra=batching)
    sleepy_model(repo, "patient", max_batch_size=8, extra=f"{batching}\n{OFF}")
    with serving(ShoalServer([str(repo)])) as srv:
        yield srv


def _timed_call(client: httpx.Client, model: str, sleep_s: float = 0.0) -> float:
    body = {"inputs": [{"name": "DELAY", "shape": [1, 1], "datatype": "FP32",
                        "data": [sleep_s]}]}
    start = time.monotonic()
    r = client.post(f"/v2/models/{model}/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return time.monotonic() - start


def test_a_lone_client_comes_back_well_before_the_delay(delay_server: ShoalServer) -> None:
    with httpx.Client(base_url=delay_server.base) as client:
        times = [_timed_call(client, "lone") for _ in range(12)]
    assert min(times[:3]) >= 0.19, f"the first requests should wait the delay: {times}"
    # after a few lone arrivals the batcher stops waiting for partners that never come
    assert max(times[-4:]) < 0.1, f"later lone requests still waited: {times}"


def test_with_the_parameter_off_a_lone_client_waits_the_whole_delay(
        delay_server: ShoalServer) -> None:
    with httpx.Client(base_url=delay_server.base) as client:
        times = [_timed_call(client, "patient") for _ in range(10)]
    assert min(times) >= 0.19, times


def test_a_burst_still_batches_after_lone_requests(delay_server: ShoalServer) -> None:
    with httpx.Client(base_url=delay_server.base) as client:
        for _ in range(10):  # teach it that partners do not come
            _timed_call(client, "burst")
        assert _timed_call(client, "burst") < 0.1
    client16 = httpclient.InferenceServerClient(delay_server.url, concurrency=16)
    before = client16.get_inference_statistics("burst")["model_stats"][0]["execution_count"]
    pending = []
    for _ in range(32):
        inp = httpclient.InferInput("DELAY", [1, 1], "FP32")
        inp.set_data_from_numpy(np.full((1, 1), 0.05, np.float32))
        pending.append(client16.async_infer("burst", [inp]))
    for p in pending:
        p.get_result()
    stats = client16.get_inference_statistics("burst")["model_stats"][0]
    sizes = [b["batch_size"] for b in stats["batch_stats"]]
    assert max(sizes) > 1, f"the burst ran one request per execution: {sizes}"
    assert stats["execution_count"] - before < 32
    client16.close()
