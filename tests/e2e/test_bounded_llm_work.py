"""Bounded work before the llm worker (issue 26 part 1), on a real server whose llm model (the
example's, with the small checkpoint of ``test_llm_serving``) sets ``shoal_max_prompt_bytes``
and whose heartbeat timeout is 2.5 s (heartbeats come every second):

- a prompt over the byte limit is refused 400 naming the limit by the frontend (OpenAI API:
  OpenAI's error object; generate), and, when it bypasses the frontend (gRPC stream, tensor
  or text form), by the worker before tokenizing (an error response on the stream); the
  worker lives on;
- a prompt just under the byte limit (megabytes, seconds of tokenizing) no longer starves the
  worker's heartbeat: it is refused by the token limit, the worker is not killed, and a stream
  in flight on the same instance gets every token.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer
from tests.e2e.test_llm_serving import Stream, build_llm_model, tensor_inputs

MAX_POSITIONS = 8192
LIMIT = 4 * 1024 * 1024  # bytes: a prompt this long takes seconds to tokenize


@pytest.fixture(scope="module")
def llm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("bounded-llm")
    config = build_llm_model(repo, MAX_POSITIONS)
    config, count = re.subn(r'"max_tokens_in_paged_kv_cache" value: \{ string_value: "\d+" \}',
                            f'"kv_cache_num_blocks" value: {{ string_value: '
                            f'"{MAX_POSITIONS // 32}" }}', config)
    assert count == 1
    config += (f'parameters {{ key: "shoal_max_prompt_bytes" '
               f'value: {{ string_value: "{LIMIT}" }} }}\n')
    (repo / "llm" / "config.pbtxt").write_text(config)
    with serving(ShoalServer([str(repo)], ["--worker-heartbeat-timeout-secs=2.5"])) as srv:
        yield srv


def _worker(srv: ShoalServer) -> int:
    pids = srv.worker_pids("llm")
    assert len(pids) == 1, pids
    return pids[0]


def _limit_named(message: str) -> bool:
    return f"prompt limit of {LIMIT} bytes" in message and "shoal_max_prompt_bytes" in message


def test_openai_over_limit_prompt_is_refused_by_the_frontend(llm_server: ShoalServer) -> None:
    worker = _worker(llm_server)
    big = "hello " * (LIMIT // 6 + 1)
    completions = httpx.post(f"{llm_server.base}/v1/completions", timeout=60, json={
        "model": "llm", "prompt": big, "max_tokens": 4})
    assert completions.status_code == 400, completions.text
    error = completions.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "prompt"
    assert _limit_named(error["message"]) and "'prompt'" in error["message"]
    chat = httpx.post(f"{llm_server.base}/v1/chat/completions", timeout=60, json={
        "model": "llm", "messages": [{"role": "user", "content": big}], "max_tokens": 4,
        "stream": True})
    assert chat.status_code == 400, chat.text
    assert chat.json()["error"]["param"] == "messages"
    assert _limit_named(chat.json()["error"]["message"])
    assert _worker(llm_server) == worker
    ok = httpx.post(f"{llm_server.base}/v1/completions", timeout=60, json={
        "model": "llm", "prompt": "Hello world", "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_generate_over_limit_prompt_is_refused(llm_server: ShoalServer) -> None:
    for route in ("generate", "generate_stream"):
        answer = httpx.post(f"{llm_server.base}/v2/models/llm/{route}", timeout=60, json={
            "text_input": "x" * (LIMIT + 1), "max_tokens": 2})
        assert answer.status_code == 400, answer.text
        assert _limit_named(answer.json()["error"])


def _text_inputs(text: str) -> list[grpcclient.InferInput]:
    prompt = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    prompt.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
    max_tokens = grpcclient.InferInput("max_tokens", [1, 1], "INT32")
    max_tokens.set_data_from_numpy(np.array([[2]], np.int32))
    return [prompt, max_tokens]


def test_grpc_over_limit_prompts_are_refused_by_the_worker(llm_server: ShoalServer) -> None:
    worker = _worker(llm_server)
    stream = Stream(llm_server)
    try:
        stream.send(_text_inputs("y" * (LIMIT + 1)))
        _result, error = stream.results.get(timeout=60)
        assert error is not None and _limit_named(error.message()), error
        # the tensor form: more token ids than the maximum sequence length, refused by count
        stream.send(tensor_inputs(list(range(3, 3 + 20)) * 1000, 2, False))
        _result, error = stream.results.get(timeout=60)
        assert error is not None, "an over-long input_ids was accepted"
        assert f"maximum sequence length {MAX_POSITIONS}" in error.message(), error.message()
        stream.send(tensor_inputs([5, 6, 7], 3, False))
        assert len(stream.tokens()) == 3
    finally:
        stream.close()
    assert _worker(llm_server) == worker


def test_near_limit_prompt_does_not_starve_the_heartbeat(llm_server: ShoalServer) -> None:
    """Tokenizing ~4 MiB takes seconds; with the GIL held all that time the worker's heartbeat
    stopped and the broker killed it (timeout 2.5 s here), failing the stream in flight."""
    worker = _worker(llm_server)
    stream = Stream(llm_server)
    length = MAX_POSITIONS - 3
    try:
        stream.send(tensor_inputs([5, 6, 7], length, True, end_id=-1))
        first, error = stream.results.get(timeout=60)  # the stream is in flight
        assert error is None, error
        near = "hello world " * ((LIMIT - 64) // 12)
        answer = httpx.post(f"{llm_server.base}/v2/models/llm/generate", timeout=120, json={
            "text_input": near, "max_tokens": 2})
        assert answer.status_code == 400, answer.text  # tokenized, then over the token limit
        assert f"exceeds the maximum sequence length {MAX_POSITIONS}" in answer.json()["error"]
        tokens = stream.tokens(timeout=120)
        first_ids = first.as_numpy("output_ids")
        assert len(tokens) + (0 if first_ids is None else first_ids.shape[-1]) == length
    finally:
        stream.close()
    assert _worker(llm_server) == worker
    assert "its heartbeat was silent" not in llm_server.log()
