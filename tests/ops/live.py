"""Helpers for the dashboard's end-to-end tests (tests/e2e/test_dashboard*.py): a small
repository, background clients that infer until stopped, and polling the stats API."""

from __future__ import annotations

import pathlib
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from tests.e2e.models import copy_example, sleepy_model

T = TypeVar("T")
SLEEPY_DELAY_S = 0.05


def build_dashboard_repository(repo: pathlib.Path) -> pathlib.Path:
    """``mlp`` (TorchScript, dynamic batching) and ``sleepy`` (one python instance that
    sleeps per request: concurrent clients queue behind it)."""
    copy_example(repo, "mlp")
    sleepy_model(repo, "sleepy")
    return repo


class Load:
    """``clients`` threads per model inferring over HTTP/JSON until ``stop`` (at most
    ``max_s`` seconds). Counts answers; any failure is kept for the test to report."""

    def __init__(self, base: str, clients: int = 2, max_s: float = 120.0) -> None:
        self.base = base
        self.done = threading.Event()
        self.answers = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._deadline = time.monotonic() + max_s
        self._threads = [threading.Thread(target=self._run, args=(model,), daemon=True)
                         for model in ("mlp", "sleepy") for _ in range(clients)]

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
                    reply = client.post(f"/v2/models/{model}/infer", json=body)
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
