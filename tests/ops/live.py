"""Helpers for the dashboard's end-to-end tests (tests/e2e/test_dashboard*.py): a small
repository, background clients that infer until stopped, and polling the stats API."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from tests.e2e.models import copy_example, sleepy_model

T = TypeVar("T")
SLEEPY_DELAY_S = 0.05
LLM_EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "llm_repository"
LLM_KV_BLOCKS = 64


def build_dashboard_repository(repo: pathlib.Path, llm: bool = False) -> pathlib.Path:
    """``mlp`` (TorchScript, dynamic batching) and ``sleepy`` (one python instance that
    sleeps per request: concurrent clients queue behind it); with ``llm``, also ``llm``
    (the example's llm-backend model over a tiny random checkpoint)."""
    copy_example(repo, "mlp")
    sleepy_model(repo, "sleepy")
    if llm:
        tiny_llm_model(repo / "llm")
    return repo


def tiny_llm_model(model_dir: pathlib.Path) -> None:
    """The example's ``llm`` model with a 2-layer checkpoint built by its ``build.py`` and a
    KV pool of ``LLM_KV_BLOCKS`` blocks."""
    (model_dir / "1").mkdir(parents=True)
    subprocess.run([sys.executable, str(LLM_EXAMPLE / "build.py"), "--output",
                    str(model_dir / "checkpoint"), "--vocab-size", "512", "--hidden-size", "64",
                    "--intermediate-size", "128", "--layers", "2", "--heads", "4",
                    "--kv-heads", "2", "--max-positions", "2048"],
                   check=True, capture_output=True)
    config, count = re.subn(
        r'"max_tokens_in_paged_kv_cache" value: \{ string_value: "\d+" \}',
        f'"kv_cache_num_blocks" value: {{ string_value: "{LLM_KV_BLOCKS}" }}',
        (LLM_EXAMPLE / "llm" / "config.pbtxt").read_text())
    assert count == 1
    (model_dir / "config.pbtxt").write_text(config)


class Load:
    """``clients`` threads per model inferring over HTTP/JSON until ``stop`` (at most
    ``max_s`` seconds), and ``llm_clients`` threads streaming ``generate_stream`` from the
    ``llm`` model. Counts answers; any failure is kept for the test to report."""

    def __init__(self, base: str, clients: int = 2, max_s: float = 120.0,
                 llm_clients: int = 0) -> None:
        self.base = base
        self.done = threading.Event()
        self.answers = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._deadline = time.monotonic() + max_s
        self._threads = [threading.Thread(target=self._run, args=(model,), daemon=True)
                         for model in ("mlp", "sleepy") for _ in range(clients)]
        self._threads += [threading.Thread(target=self._run, args=("llm",), daemon=True)
                          for _ in range(llm_clients)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.done.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _body(self, model: str) -> dict[str, Any]:
        if model == "llm":
            return {"text_input": "Hello dashboard", "max_tokens": 24, "stream": True,
                    "end_id": -1}
        if model == "mlp":
            return {"inputs": [{"name": "INPUT__0", "shape": [2, 256], "datatype": "FP32",
                                "data": [0.5] * 512}]}
        return {"inputs": [{"name": "DELAY", "shape": [1], "datatype": "FP32",
                            "data": [SLEEPY_DELAY_S]}]}

    def _run(self, model: str) -> None:
        body = self._body(model)
        with httpx.Client(base_url=self.base, timeout=30) as client:
            while not self.done.is_set() and time.monotonic() < self._deadline:
                try:
                    route = "generate_stream" if model == "llm" else "infer"
                    reply = client.post(f"/v2/models/{model}/{route}", json=body)
                except httpx.HTTPError as exc:
                    with self._lock:
                        self.failures.append(f"{model}: {exc!r}")
                    time.sleep(0.1)
                    continue
                with self._lock:
                    if reply.status_code == 200:
                        self.answers += 1
                    else:
                        self.failures.append(f"{model}: {reply.status_code} {reply.text}")


def stats(metrics_port: int, headers: dict[str, str] | None = None) -> dict[str, Any]:
    reply = httpx.get(f"http://127.0.0.1:{metrics_port}/dashboard/api/stats",
                      headers=headers, timeout=10)
    reply.raise_for_status()
    document: dict[str, Any] = reply.json()
    return document


def wait_for(probe: Callable[[], T | None], timeout_s: float = 30.0, what: str = "") -> T:
    """Call ``probe`` every 0.2 s until it returns something other than None."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


def model_row(document: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in document["models"] if m["name"] == name)
