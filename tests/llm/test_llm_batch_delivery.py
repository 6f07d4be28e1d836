"""The ``llm`` backend's delivery of a batch of several items, driven response by response: an
in-memory stand-in for the executor (ids, cancels) and a list for the worker's response sink.
Streaming: one response per item response, the final flag only on the last; non-streaming: one
stacked response; an item that fails sends one error, cancels the other items, and the request
ends when the last of them has. (The server path is in tests/e2e/test_llm_batch.py.)"""

from __future__ import annotations

from typing import Any

import numpy as np

from shoal.llm import FinishReason, Request, Response, Result
from shoal.messages import Error
from shoal.workers.backends.base import BackendRequest, BackendResponse
from shoal.workers.backends.llm.backend import LlmBackend


class _Executor:
    def __init__(self) -> None:
        self.next_id = 100
        self.cancelled: list[int] = []

    def check_request(self, request: Request) -> str | None:
        return None

    def enqueue_requests(self, requests: list[Request]) -> list[int]:
        ids = list(range(self.next_id, self.next_id + len(requests)))
        self.next_id += len(requests)
        return ids

    def cancel_request(self, request_id: int) -> None:
        self.cancelled.append(request_id)


def _backend() -> tuple[LlmBackend, _Executor, list[tuple[int, Any, bool]]]:
    backend = LlmBackend()
    executor = _Executor()
    sent: list[tuple[int, Any, bool]] = []
    backend._executor = executor  # type: ignore[assignment]
    backend._batching, backend._max_batch_size, backend._declares_batch_index = True, 8, True
    backend._send = lambda worker_id, answer, final: sent.append((worker_id, answer, final))
    return backend, executor, sent


def _submit(backend: LlmBackend, streaming: bool) -> None:
    inputs = {"input_ids": np.array([[5, 6], [7, 0], [8, 9]], np.int32),
              "input_lengths": np.array([[2], [1], [2]], np.int32),
              "request_output_len": np.array([[3], [3], [3]], np.int32),
              "pad_id": np.array([[0], [0], [0]], np.int32),
              "streaming": np.array([[streaming]] * 3)}
    assert backend.execute([BackendRequest(7, inputs, {}, [], {})]) == [None]


def _result(tokens: list[int], final: bool) -> Result:
    return Result(is_final=final, output_token_ids=[tokens],
                  finish_reasons=[FinishReason.LENGTH if final else FinishReason.NOT_FINISHED])


def _outputs(answer: Any) -> dict[str, list[Any]]:
    assert isinstance(answer, BackendResponse)
    return {t.name: t.array.tolist() for t in answer.outputs}


def test_streaming_items_answer_one_by_one_and_the_last_one_closes() -> None:
    backend, _, sent = _backend()
    _submit(backend, streaming=True)
    for request_id, tokens, final in [(101, [4], False), (100, [3], False), (101, [5], True),
                                      (100, [6], True), (102, [7], True)]:
        backend._deliver(Response(request_id, _result(tokens, final)))
    assert [f for _, _, f in sent] == [False, False, False, False, True]
    got = [(_outputs(a)["batch_index"], _outputs(a)["output_ids"]) for _, a, _ in sent]
    assert got == [([[1]], [[[4]]]), ([[0]], [[[3]]]), ([[1]], [[[5]]]), ([[0]], [[[6]]]),
                   ([[2]], [[[7]]])]


def test_a_non_streaming_batch_answers_once_with_every_item() -> None:
    backend, _, sent = _backend()
    _submit(backend, streaming=False)
    backend._deliver(Response(102, _result([7], True)))
    backend._deliver(Response(100, _result([3, 4, 5], True)))
    assert sent == []  # held until the last item ends
    backend._deliver(Response(101, _result([6, 6], True)))
    ((worker_id, answer, final),) = sent
    outputs = _outputs(answer)
    assert (worker_id, final) == (7, True)
    assert outputs["output_ids"] == [[[3, 4, 5]], [[6, 6, 0]], [[7, 0, 0]]]
    assert outputs["sequence_length"] == [[3], [2], [1]]
    assert outputs["batch_index"] == [[0], [1], [2]]


def test_a_failed_item_sends_one_error_and_cancels_the_others() -> None:
    backend, executor, sent = _backend()
    _submit(backend, streaming=True)
    backend._deliver(Response(100, _result([3], False)))
    backend._deliver(Response(101, error_msg="device lost"))
    assert sorted(executor.cancelled) == [100, 102]
    assert isinstance(sent[-1][1], Error) and "device lost" in sent[-1][1].message
    assert sent[-1][2] is False  # two items still to close
    backend._deliver(Response(100, _result([4], False)))  # cancelled: dropped
    backend._deliver(Response(100, _result([], True)))
    backend._deliver(Response(102, _result([], True)))
    assert [(a, f) for _, a, f in sent[2:]] == [(None, True)]
    assert backend._open == {}
