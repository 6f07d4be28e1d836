"""Requests of several sequences on the ``llm`` backend (TensorRT-LLM's ``tensorrt_llm`` model
rules), on the example's model and tiny checkpoint of ``test_llm_serving.py``: a batch of 3
different prompts gives, per item, the greedy tokens of the 3 sent one by one, streamed
(responses of one item each, named by ``batch_index``, the final flag once all have ended) or
not (one response, rows padded); the text form likewise against HTTP ``generate``; a batch above
``max_batch_size`` is refused; cancelling a streaming batch gives back the KV blocks of all its
items."""

from __future__ import annotations

import re
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.server import ShoalServer
from tests.e2e.test_llm_serving import (  # noqa: F401  (module fixtures, shared)
    EOS,
    EXAMPLE,
    MAX_POSITIONS,
    NUM_BLOCKS,
    PROMPTS,
    Stream,
    generate,
    hf_greedy,
    hf_model,
    llm_repo,
    llm_server,
    tensor_inputs,
    tokenizer,
    wait_for_kv_blocks,
    wait_until_kv_blocks_are_used,
)

MAX_BATCH_SIZE = int(re.search(r"^max_batch_size: (\d+)",  # type: ignore[union-attr]
                               (EXAMPLE / "llm" / "config.pbtxt").read_text(), re.M).group(1))
PAD = 0


def _tensor(name: str, array: np.ndarray[Any, Any], datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def batch_inputs(prompts: list[list[int]], max_tokens: list[int],
                 streaming: bool) -> list[grpcclient.InferInput]:
    """``input_ids`` [N, longest] padded with PAD, ``input_lengths`` / ``request_output_len`` /
    ``streaming`` [N, 1] (TensorRT-LLM's batch layout)."""
    ids = np.full((len(prompts), max(len(p) for p in prompts)), PAD, np.int32)
    for row, prompt in enumerate(prompts):
        ids[row, :len(prompt)] = prompt
    column = np.array([[len(p)] for p in prompts], np.int32)
    return [_tensor("input_ids", ids, "INT32"), _tensor("input_lengths", column, "INT32"),
            _tensor("request_output_len", np.array([[m] for m in max_tokens], np.int32),
                    "INT32"),
            _tensor("streaming", np.array([[streaming]] * len(prompts)), "BOOL")]


def responses(stream: Stream, timeout: float = 60.0) -> list[tuple[Any, bool]]:
    """Every response of the request in flight as (result, final flag), the final one last."""
    got: list[tuple[Any, bool]] = []
    while True:
        result, error = stream.results.get(timeout=timeout)
        assert error is None, error
        final = result.get_response().parameters["triton_final_response"].bool_param
        got.append((result, final))
        if final:
            return got


def streamed_tokens(got: list[tuple[Any, bool]]) -> dict[int, list[int]]:
    """Tokens per batch item from streamed responses: each holds one item (a batch dimension of
    1) and names it in ``batch_index``."""
    tokens: dict[int, list[int]] = {}
    for result, _ in got:
        ids = result.as_numpy("output_ids")
        if ids is None:  # an empty final response
            continue
        index = result.as_numpy("batch_index")
        assert index is not None and index.shape == (1, 1), "a response without its item"
        assert ids.shape[:2] == (1, 1)
        length = int(result.as_numpy("sequence_length")[0, 0])
        tokens.setdefault(int(index[0, 0]), []).extend(ids[0, 0, :length].tolist())
    return tokens


@pytest.fixture(scope="module")
def prompts(tokenizer: Any) -> list[list[int]]:  # noqa: F811
    return [tokenizer.encode(p).ids for p in PROMPTS[:3]]  # 3 different lengths


MAX_TOKENS = [10, 14, 18]


@pytest.fixture(scope="module")
def one_by_one(llm_server: ShoalServer, prompts: list[list[int]]  # noqa: F811
               ) -> list[list[int]]:
    """Each prompt's greedy tokens, sent alone (a batch of one)."""
    stream = Stream(llm_server)
    try:
        expected = []
        for prompt, max_tokens in zip(prompts, MAX_TOKENS, strict=True):
            stream.send(tensor_inputs(prompt, max_tokens, streaming=True))
            expected.append(stream.tokens())
        return expected
    finally:
        stream.close()


def test_one_by_one_equals_hf_greedy(one_by_one: list[list[int]], prompts: list[list[int]],
                                     hf_model: Any) -> None:  # noqa: F811
    assert one_by_one == [hf_greedy(hf_model, p, m, None)
                          for p, m in zip(prompts, MAX_TOKENS, strict=True)]


def test_streaming_batch_equals_one_by_one(llm_server: ShoalServer,  # noqa: F811
                                           prompts: list[list[int]],
                                           one_by_one: list[list[int]]) -> None:
    stream = Stream(llm_server)
    try:
        stream.send(batch_inputs(prompts, MAX_TOKENS, streaming=True))
        got = responses(stream)
    finally:
        stream.close()
    assert [final for _, final in got] == [False] * (len(got) - 1) + [True]
    assert len(got) > len(prompts)  # token by token, not one answer per item
    tokens = streamed_tokens(got)
    assert sorted(tokens) == [0, 1, 2]
    assert [tokens[i] for i in range(3)] == one_by_one


def test_non_streaming_batch_is_one_padded_response(llm_server: ShoalServer,  # noqa: F811
                                                    prompts: list[list[int]],
                                                    one_by_one: list[list[int]]) -> None:
    stream = Stream(llm_server)
    try:
        stream.send(batch_inputs(prompts, MAX_TOKENS, streaming=False))
        got = responses(stream)
    finally:
        stream.close()
    assert len(got) == 1
    result = got[0][0]
    ids, lengths = result.as_numpy("output_ids"), result.as_numpy("sequence_length")
    assert ids.shape == (3, 1, max(MAX_TOKENS)) and lengths.shape == (3, 1)
    assert result.as_numpy("batch_index").tolist() == [[0], [1], [2]]
    for row, expected in enumerate(one_by_one):
        length = int(lengths[row, 0])
        assert ids[row, 0, :length].tolist() == expected
        assert (ids[row, 0, length:] == EOS).all()  # padded with the pad id (here the eos)


def test_text_batch_equals_generate_one_by_one(llm_server: ShoalServer) -> None:  # noqa: F811
    texts = PROMPTS[3:6]
    expected = []
    for text in texts:
        r = generate(llm_server, "generate", {"text_input": text, "max_tokens": 12})
        assert r.status_code == 200, r.text
        assert "batch_index" not in r.json()  # a batch of one answers as before
        expected.append(r.json()["text_output"])
    text_input = np.array([[t.encode()] for t in texts], dtype=object)
    inputs = [_tensor("text_input", text_input, "BYTES"),
              _tensor("max_tokens", np.array([[12]] * 3, np.int32), "INT32")]
    stream = Stream(llm_server)
    try:
        stream.client.async_stream_infer(
            "llm", [*inputs, _tensor("stream", np.array([[True]] * 3), "BOOL")],
            enable_empty_final_response=True)
        streamed = responses(stream)
        stream.client.async_stream_infer("llm", inputs, enable_empty_final_response=True)
        whole = responses(stream)
    finally:
        stream.close()
    pieces: dict[int, str] = {}
    for result, _ in streamed:
        text = result.as_numpy("text_output")
        if text is not None:
            index = int(result.as_numpy("batch_index")[0, 0])
            pieces[index] = pieces.get(index, "") + text[0, 0].decode()
    assert [pieces.get(i) for i in range(3)] == expected
    assert len(whole) == 1
    assert [t[0].decode() for t in whole[0][0].as_numpy("text_output")] == expected


def test_batch_index_named_on_a_batch_of_one(llm_server: ShoalServer,  # noqa: F811
                                             prompts: list[list[int]],
                                             one_by_one: list[list[int]]) -> None:
    stream = Stream(llm_server)
    try:
        stream.client.async_stream_infer(
            "llm", tensor_inputs(prompts[0], MAX_TOKENS[0], streaming=False),
            outputs=[grpcclient.InferRequestedOutput(n)
                     for n in ("output_ids", "sequence_length", "batch_index")])
        result, error = stream.results.get(timeout=60)
    finally:
        stream.close()
    assert error is None, error
    assert result.as_numpy("batch_index").tolist() == [[0]]
    assert result.as_numpy("output_ids")[0, 0].tolist() == one_by_one[0]


def test_a_batch_above_max_batch_size_is_refused(llm_server: ShoalServer,  # noqa: F811
                                                 prompts: list[list[int]]) -> None:
    size = MAX_BATCH_SIZE + 1
    stream = Stream(llm_server)
    try:
        stream.send(batch_inputs([prompts[0]] * size, [4] * size, streaming=True))
        _, error = stream.results.get(timeout=30)
        # Triton's INVALID_ARG (HTTP 400) message, in-band on the stream (no status there)
        assert isinstance(error, InferenceServerException)
        assert f"batch-size must be <= {MAX_BATCH_SIZE} for 'llm'" in error.message()
        unpadded = [_tensor("input_ids", np.array([prompts[0][:2]] * 2, np.int32), "INT32"),
                    _tensor("request_output_len", np.array([[4]] * 2, np.int32), "INT32")]
        stream.send(unpadded)  # several rows need their lengths
        _, error = stream.results.get(timeout=30)
        assert isinstance(error, InferenceServerException)
        assert "input_lengths" in error.message()
        stream.send(batch_inputs(prompts[:2], [4, 10**6], streaming=True))  # item 1 too long
        _, error = stream.results.get(timeout=30)
        assert isinstance(error, InferenceServerException)
        assert "batch item 1" in error.message() and "request_output_len" in error.message()
        stream.send(batch_inputs(prompts[:2], [4, 4], streaming=False))  # still serving
        ((result, _),) = responses(stream)
        assert result.as_numpy("sequence_length").tolist() == [[4], [4]]
    finally:
        stream.close()


def test_cancelled_streaming_batch_frees_every_items_kv_blocks(
        llm_server: ShoalServer, prompts: list[list[int]]) -> None:  # noqa: F811
    # three items that fit the pool together (about a quarter each) and would stream for
    # seconds: cancelling the one client request must stop all three
    long = [MAX_POSITIONS // 4 - len(p) for p in prompts]
    stream = Stream(llm_server)
    try:
        stream.send(batch_inputs(prompts, long, streaming=True))
        seen: set[int] = set()
        while seen != {0, 1, 2}:
            result, error = stream.results.get(timeout=30)
            assert error is None, error
            seen.add(int(result.as_numpy("batch_index")[0, 0]))
        wait_until_kv_blocks_are_used(llm_server)
    finally:
        stream.close(cancel=True)
    wait_for_kv_blocks(llm_server, "used", 0, timeout=10)
    wait_for_kv_blocks(llm_server, "free", NUM_BLOCKS, timeout=5)
    r = httpx.post(f"{llm_server.base}/v2/models/llm/generate",
                   json={"text_input": PROMPTS[0], "max_tokens": 4}, timeout=60)
    assert r.status_code == 200, r.text
