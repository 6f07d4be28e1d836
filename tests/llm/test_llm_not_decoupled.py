"""The ``llm`` backend not decoupled: ``execute`` waits for each request's final result from the
executor's loop thread and returns it; should that thread die, the waiting requests answer
INTERNAL instead of blocking the worker for ever. An in-memory stand-in for the executor."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from shoal.errors import ErrorCode
from shoal.llm import FinishReason, Request, Response, Result
from shoal.messages import Error
from shoal.workers.backends.base import BackendRequest, BackendResponse
from shoal.workers.backends.llm import backend as llm_backend
from shoal.workers.backends.llm.backend import LlmBackend


class _Executor:
    def __init__(self, alive: bool = True) -> None:
        self.alive = alive
        self.enqueued = threading.Event()

    def check_request(self, request: Request) -> str | None:
        return None

    def enqueue_requests(self, requests: list[Request]) -> list[int]:
        self.enqueued.set()
        return list(range(100, 100 + len(requests)))

    def cancel_request(self, request_id: int) -> None:
        pass

    def loop_alive(self) -> bool:
        return self.alive


def _backend(executor: _Executor) -> LlmBackend:
    backend = LlmBackend()
    backend._executor = executor  # type: ignore[assignment]
    backend._decoupled = False
    backend._batching, backend._max_batch_size = True, 8
    backend._send = backend._collect
    return backend


def _request() -> BackendRequest:
    inputs = {"input_ids": np.array([[5, 6]], np.int32),
              "input_lengths": np.array([[2]], np.int32),
              "request_output_len": np.array([[3]], np.int32)}
    return BackendRequest(7, inputs, {}, [], {})


def test_the_final_result_from_the_loop_thread_is_the_answer() -> None:
    executor = _Executor()
    backend = _backend(executor)

    def deliver() -> None:
        executor.enqueued.wait(5)
        with backend._lock:
            backend._deliver(Response(100, Result(is_final=True, output_token_ids=[[3, 4]],
                                                  finish_reasons=[FinishReason.LENGTH])))

    thread = threading.Thread(target=deliver)
    thread.start()
    [answer] = backend.execute([_request()])
    thread.join()
    assert isinstance(answer, BackendResponse), answer
    assert not backend._collected and not backend._open


def test_a_dead_loop_thread_answers_internal_instead_of_blocking(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llm_backend, "LIVENESS_CHECK_S", 0.02)
    executor = _Executor()
    backend = _backend(executor)

    def die() -> None:  # the loop thread dies after the request was enqueued
        executor.enqueued.wait(5)
        time.sleep(0.05)
        executor.alive = False

    thread = threading.Thread(target=die)
    thread.start()
    started = time.monotonic()
    [answer] = backend.execute([_request()])
    thread.join()
    assert time.monotonic() - started < 5
    assert isinstance(answer, Error) and answer.code == ErrorCode.INTERNAL, answer
    assert "executor has stopped" in answer.message
    assert not backend._open, "the stranded request is forgotten"
