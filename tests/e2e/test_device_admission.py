"""Device memory admission through the real processes, on the test suite's fake GPUs
(``tests.fakes.gpus``, declared through ``SHOAL_DEVICE_INVENTORY``): two KIND_GPU models that
each fit the device limit alone but not together — the second load is refused with the device,
the need and what is free, the first keeps serving; unloading the first gives the memory back."""

from __future__ import annotations

import json
import pathlib
import time

import httpx
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import serving
from tests.e2e.control_models import config_pbtxt, infer_probe, probe_config, probe_model
from tests.e2e.server import ShoalServer
from tests.fakes.gpus import fake_gpus_env


def _gpu_probe(repo: pathlib.Path, name: str, tag: int) -> None:
    probe_model(repo, name, tag=tag)
    config = probe_config(name, tag=tag)
    config["instance_group"] = [{"kind": "KIND_GPU", "count": 1, "gpus": [0]}]
    config["parameters"]["shoal_device_memory_bytes"] = {"string_value": "300MiB"}
    (repo / name / "config.pbtxt").write_text(config_pbtxt(config))


def test_second_load_over_the_limit_is_refused(tmp_path: pathlib.Path) -> None:
    _gpu_probe(tmp_path, "gpu_a", 1)
    _gpu_probe(tmp_path, "gpu_b", 2)
    args = ["--model-control-mode=explicit", "--model-load-device-limit=0:0.5",
            "--model-load-device-margin-bytes=0"]
    env = fake_gpus_env("0:1GiB")  # limit: 512 MiB; each model needs 300 MiB
    with serving(ShoalServer([str(tmp_path)], args, env=env)) as srv:
        client = httpclient.InferenceServerClient(srv.url)
        client.load_model("gpu_a")
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("gpu_b")
        message = str(refused.value)
        assert refused.value.status() == "400"
        assert "GPU 0 needs 0.29 GiB" in message and "0.21 GiB" in message, message
        assert "'gpu_a'" in message  # who holds the memory
        assert infer_probe(client, "gpu_a")["tag"] == 1  # the first one serves on
        assert not client.is_model_ready("gpu_b")
        assert not srv.worker_pids("gpu_b")  # refused before any worker started

        client.unload_model("gpu_a")
        deadline = time.monotonic() + 20
        # the ledger gives gpu_a's memory back once the broker has reaped its workers (a
        # worker that exited may still be a zombie for a moment, out of psutil's view)
        while (srv.worker_pids("gpu_a") or 'model="gpu_a"' in _ledger_lines(srv)) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        client.load_model("gpu_b")  # the memory came back when gpu_a's workers stopped
        assert infer_probe(client, "gpu_b")["tag"] == 2

        # a reload holds old and new at once: 2 x 300 MiB does not fit under 512 MiB
        with pytest.raises(InferenceServerException, match="device memory admission"):
            client.load_model("gpu_b", config=json.dumps(
                {**probe_config("gpu_b", tag=3),
                 "instance_group": [{"kind": "KIND_GPU", "count": 1, "gpus": [0]}],
                 "parameters": {"shoal_device_memory_bytes": {"string_value": "300MiB"}}}))
        assert infer_probe(client, "gpu_b")["tag"] == 2
        client.close()


def _ledger_lines(srv: ShoalServer) -> str:
    """The device ledger's reservations as /metrics shows them."""
    text = httpx.get(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10).text
    return "\n".join(line for line in text.splitlines()
                     if line.startswith("shoal_device_memory_reserved_bytes"))
