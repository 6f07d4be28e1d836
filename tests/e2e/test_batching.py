"""Dynamic batching, several instances, and the TorchScript MLP against the in-process model."""

from __future__ import annotations

import concurrent.futures
import pathlib

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient

from tests.e2e.models import EXAMPLES
from tests.e2e.server import ShoalServer


def _sleepy_inputs(delay: float) -> list[httpclient.InferInput]:
    inp = httpclient.InferInput("DELAY", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[delay]], np.float32))
    return [inp]


def test_mlp_matches_in_process_model(server: ShoalServer) -> None:
    module = torch.jit.load(str(pathlib.Path(EXAMPLES) / "mlp" / "1" / "model.pt"))
    x = np.random.default_rng(0).standard_normal((5, 256)).astype(np.float32)
    with torch.inference_mode():
        expected = module(torch.from_numpy(x)).numpy()
    client = httpclient.InferenceServerClient(server.url)
    inp = httpclient.InferInput("INPUT__0", [5, 256], "FP32")
    inp.set_data_from_numpy(x)
    got = client.infer("mlp", [inp]).as_numpy("OUTPUT__0")
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_concurrent_clients_get_batched(server: ShoalServer) -> None:
    """32 concurrent clients: the broker forms executions of more than one request (observed in
    the statistics extension's batch_stats), and every client gets its own answer back."""
    client = httpclient.InferenceServerClient(server.url, concurrency=32)
    before = client.get_inference_statistics("batch_probe")["model_stats"][0]
    sizes_before = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    delays = [0.01 + i * 1e-4 for i in range(64)]
    pending = [client.async_infer("batch_probe", _sleepy_inputs(d)) for d in delays]
    answers = [p.get_result().as_numpy("DELAY_OUT")[0, 0] for p in pending]
    np.testing.assert_allclose(answers, delays, rtol=1e-6)
    stats = client.get_inference_statistics("batch_probe")["model_stats"][0]
    # deltas: the server is shared with other modules, which may have used the model too
    sizes = [b["batch_size"] for b in stats["batch_stats"]
             if b["compute_infer"]["count"] > sizes_before.get(b["batch_size"], 0)]
    assert max(sizes) > 1, f"no execution had more than one row: {sizes}"
    assert stats["inference_count"] - before["inference_count"] == 64
    assert stats["execution_count"] - before["execution_count"] < 64


def test_multi_row_requests_batch_together(server: ShoalServer) -> None:
    rows = [4, 8, 2, 6]

    def one(n: int) -> np.ndarray:
        # tritonclient.http runs on gevent: a client belongs to the thread that made it.
        client = httpclient.InferenceServerClient(server.url)
        inp = httpclient.InferInput("INPUT0", [n, 4], "FP32")
        data = np.full((n, 4), n, np.float32)
        inp.set_data_from_numpy(data)
        return client.infer("identity_batched", [inp]).as_numpy("OUTPUT0")

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, rows))
    for n, got in zip(rows, results, strict=True):
        np.testing.assert_array_equal(got, np.full((n, 4), n, np.float32))


def test_two_instances_are_two_processes_that_both_execute(server: ShoalServer) -> None:
    pids = server.worker_pids("sleepy_pair")
    assert len(pids) == 2
    client = httpclient.InferenceServerClient(server.url, concurrency=8)
    inp = httpclient.InferInput("DELAY", [1], "FP32")
    inp.set_data_from_numpy(np.array([0.2], np.float32))
    pending = [client.async_infer("sleepy_pair", [inp]) for _ in range(8)]
    seen = {int(p.get_result().as_numpy("PID")[0]) for p in pending}
    assert seen == set(pids)


@pytest.mark.parametrize("model", ["identity_fp32"])
def test_example_dynamic_batching_model(server: ShoalServer, model: str) -> None:
    client = httpclient.InferenceServerClient(server.url)
    inp = httpclient.InferInput("INPUT0", [3, 16], "FP32")
    data = np.arange(48, dtype=np.float32).reshape(3, 16)
    inp.set_data_from_numpy(data)
    np.testing.assert_array_equal(client.infer(model, [inp]).as_numpy("OUTPUT0"), data)
