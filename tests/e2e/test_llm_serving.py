"""The ``llm`` backend on a real server: the example repository's model (its config, a smaller
checkpoint built by its ``build.py``) through Triton's generate / generate_stream (text form)
and tritonclient gRPC streaming (TensorRT-LLM tensor form). Greedy outputs equal Hugging Face
``generate`` on the same checkpoint; concurrent streams stay independent; a cancelled stream
gives its KV blocks back (the ``nv_trt_llm_kv_cache_block_metrics`` gauge); hostile requests
are refused naming the input and the model keeps serving."""

from __future__ import annotations

import atexit
import json
import pathlib
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llm_repository"
MAX_POSITIONS = 8192
NUM_BLOCKS = MAX_POSITIONS // 32  # one request may take the whole pool
EOS = 2
PROMPTS = ["Hello world", "The quick brown fox", "Café au lait 日本語", "one, two, three",
           "Machine learning", "A small model", "Emoji too: 🙂", "Zürich and Kraków"]


_PRISTINE: dict[int, pathlib.Path] = {}  # max_positions -> this session's untouched build


def _pristine_checkpoint(max_positions: int) -> pathlib.Path:
    """The example's ``build.py`` output for ``max_positions``, built once per test session
    (~4 s each: several modules serve the same small checkpoint) into a private temp dir that
    is removed at exit; callers copy it, so what a test changes in its copy stays there."""
    built = _PRISTINE.get(max_positions)
    if built is None:
        root = pathlib.Path(tempfile.mkdtemp(prefix="shoal-llm-checkpoint-"))
        atexit.register(shutil.rmtree, root, True)
        built = root / "checkpoint"
        subprocess.run([sys.executable, str(EXAMPLE / "build.py"), "--output", str(built),
                        "--vocab-size", "512", "--hidden-size", "64", "--intermediate-size",
                        "128", "--layers", "2", "--heads", "4", "--kv-heads", "2",
                        "--max-positions", str(max_positions)], check=True, capture_output=True)
        _PRISTINE[max_positions] = built
    return built


def build_llm_model(repo: pathlib.Path, max_positions: int) -> str:
    """``repo/llm`` with its version folder and a small checkpoint built by the example's
    ``build.py``; returns the example's config.pbtxt text for the caller to adjust and write."""
    (repo / "llm" / "1").mkdir(parents=True)
    shutil.copytree(_pristine_checkpoint(max_positions), repo / "llm" / "checkpoint")
    return (EXAMPLE / "llm" / "config.pbtxt").read_text()


@pytest.fixture(scope="module")
def llm_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    repo = tmp_path_factory.mktemp("llm-repo")
    config = build_llm_model(repo, MAX_POSITIONS)
    config, count = re.subn(r'"max_tokens_in_paged_kv_cache" value: \{ string_value: "\d+" \}',
                            f'"kv_cache_num_blocks" value: {{ string_value: "{NUM_BLOCKS}" }}',
                            config)
    assert count == 1
    (repo / "llm" / "config.pbtxt").write_text(config)
    return repo


@pytest.fixture(scope="module")
def llm_server(llm_repo: pathlib.Path) -> Iterator[ShoalServer]:
    with serving(ShoalServer([str(llm_repo)])) as srv:
        yield srv


@pytest.fixture(scope="module")
def tokenizer(llm_repo: pathlib.Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(llm_repo / "llm" / "checkpoint" / "tokenizer.json"))


@pytest.fixture(scope="module")
def hf_model(llm_repo: pathlib.Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(llm_repo / "llm" / "checkpoint")


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int,
              end_id: int | None) -> list[int]:
    """Hugging Face greedy continuation; the end id (if produced) and what follows dropped."""
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=0, eos_token_id=end_id)
    generated: list[int] = out[0, len(prompt):].tolist()
    if end_id is not None and end_id in generated:
        generated = generated[:generated.index(end_id)]
    return generated


def generate(server: ShoalServer, route: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.base}/v2/models/llm/{route}", json=body, timeout=60)


def sse_texts(response: httpx.Response) -> list[str]:
    chunks = response.content.split(b"\n\n")
    assert chunks[-1] == b""
    return [json.loads(c[len(b"data: "):])["text_output"] for c in chunks[:-1]]


def tensor_inputs(prompt: list[int], max_tokens: int, streaming: bool,
                  **scalars: int) -> list[grpcclient.InferInput]:
    tensors = [("input_ids", np.array([prompt], np.int32)),
               ("request_output_len", np.array([[max_tokens]], np.int32))]
    tensors += [(name, np.array([[value]], np.int32)) for name, value in scalars.items()]
    inputs = []
    for name, array in tensors:
        tensor = grpcclient.InferInput(name, list(array.shape), "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    flag = grpcclient.InferInput("streaming", [1, 1], "BOOL")
    flag.set_data_from_numpy(np.array([[streaming]], bool))
    return [*inputs, flag]


class Stream:
    """One tritonclient gRPC stream; ``results`` yields (output_ids, error) per response."""

    def __init__(self, server: ShoalServer) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.results: queue.Queue[tuple[Any, InferenceServerException | None]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def send(self, inputs: list[grpcclient.InferInput], request_id: str = "") -> None:
        self.client.async_stream_infer("llm", inputs, request_id=request_id,
                                       enable_empty_final_response=True)

    def tokens(self, timeout: float = 60.0) -> list[int]:
        """Every generated token until the final response."""
        tokens: list[int] = []
        while True:
            result, error = self.results.get(timeout=timeout)
            assert error is None, error
            ids = result.as_numpy("output_ids")
            if ids is not None:
                lengths = result.as_numpy("sequence_length")
                tokens.extend(ids[0, 0, :lengths[0, 0]].tolist())
            if result.get_response().parameters["triton_final_response"].bool_param:
                return tokens

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def kv_blocks(server: ShoalServer, kind: str) -> float | None:
    """The KV block gauge's ``kind`` series; None when a scrape lacks it (a stats query that
    timed out under load)."""
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    match = re.search(r'nv_trt_llm_kv_cache_block_metrics\{kv_cache_block_type="' + kind +
                      r'",model="llm",version="1"\} (\S+)', text)
    return float(match.group(1)) if match else None


def wait_for_kv_blocks(server: ShoalServer, kind: str, wanted: float, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (value := kv_blocks(server, kind)) != wanted:
        assert time.monotonic() < deadline, f"KV blocks {kind}: {value}, wanted {wanted}"
        time.sleep(0.1)


def wait_until_kv_blocks_are_used(server: ShoalServer) -> None:
    deadline = time.monotonic() + 10
    while not (kv_blocks(server, "used") or 0) > 0:  # the gauge lags up to 1 s
        assert time.monotonic() < deadline, "the running request holds no KV block"
        time.sleep(0.1)


# ------------------------------------------------------------------ greedy == Hugging Face


def test_generate_text_equals_hf_greedy(llm_server: ShoalServer, tokenizer: Any,
                                        hf_model: Any) -> None:
    r = generate(llm_server, "generate", {"text_input": PROMPTS[0], "max_tokens": 12})
    assert r.status_code == 200, r.text
    expected = hf_greedy(hf_model, tokenizer.encode(PROMPTS[0]).ids, 12, EOS)
    assert r.json()["text_output"] == tokenizer.decode(expected)


def test_generate_stream_text_equals_hf_greedy(llm_server: ShoalServer, tokenizer: Any,
                                               hf_model: Any) -> None:
    prompt = PROMPTS[2]  # multi-byte characters: pieces must never split one
    r = generate(llm_server, "generate_stream",
                 {"text_input": prompt, "max_tokens": 24, "stream": True})
    assert r.status_code == 200, r.text
    pieces = sse_texts(r)
    expected = tokenizer.decode(hf_greedy(hf_model, tokenizer.encode(prompt).ids, 24, EOS))
    assert "".join(pieces) == expected
    assert len(pieces) > 1


def test_grpc_stream_tensor_form_equals_hf_greedy(llm_server: ShoalServer, tokenizer: Any,
                                                  hf_model: Any) -> None:
    prompt = tokenizer.encode(PROMPTS[1]).ids
    expected = hf_greedy(hf_model, prompt, 16, None)
    stream = Stream(llm_server)
    try:
        stream.send(tensor_inputs(prompt, 16, streaming=True))
        assert stream.tokens() == expected
        stream.send(tensor_inputs(prompt, 16, streaming=False))  # one response, all tokens
        assert stream.tokens() == expected
    finally:
        stream.close()


def test_concurrent_streams_are_independent(llm_server: ShoalServer, tokenizer: Any,
                                            hf_model: Any) -> None:
    prompts = [tokenizer.encode(p).ids for p in PROMPTS]
    expected = [hf_greedy(hf_model, p, 20, None) for p in prompts]
    got: dict[int, list[int] | BaseException] = {}

    def client(index: int) -> None:
        time.sleep(0.02 * index)  # staggered: requests join a batch already running
        stream = Stream(llm_server)
        try:
            stream.send(tensor_inputs(prompts[index], 20, streaming=True))
            got[index] = stream.tokens()
        except BaseException as exc:
            got[index] = exc
        finally:
            stream.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert got == dict(enumerate(expected))


def test_tensor_form_stop_words_end_id_and_log_probs(llm_server: ShoalServer, tokenizer: Any,
                                                     hf_model: Any) -> None:
    prompt = tokenizer.encode(PROMPTS[4]).ids
    expected = hf_greedy(hf_model, prompt, 16, None)
    stop = expected[5]
    until_stop = expected[:expected.index(stop) + 1]  # a stop word is kept (TRT-LLM)
    end = expected[3]
    until_end = expected[:expected.index(end)]  # the end id is not
    stream = Stream(llm_server)
    try:
        words = grpcclient.InferInput("stop_words_list", [1, 2, 1], "INT32")
        words.set_data_from_numpy(np.array([[[stop], [1]]], np.int32))
        stream.send([*tensor_inputs(prompt, 16, streaming=False), words])
        assert stream.tokens() == until_stop
        stream.send(tensor_inputs(prompt, 16, streaming=False, end_id=end))
        assert stream.tokens() == until_end
        log_probs = grpcclient.InferInput("return_log_probs", [1, 1], "BOOL")
        log_probs.set_data_from_numpy(np.array([[True]]))
        stream.send([*tensor_inputs(prompt, 16, streaming=False), log_probs])
        result, error = stream.results.get(timeout=60)
        assert error is None, error
        per_token = result.as_numpy("output_log_probs")
        assert per_token.shape == (1, 1, 16) and (per_token < 0).all()
        assert result.as_numpy("cum_log_probs")[0, 0] == pytest.approx(per_token.sum(), rel=1e-4)
    finally:
        stream.close()


# ------------------------------------------------------------------ cancellation


def test_cancelled_stream_frees_its_kv_blocks(llm_server: ShoalServer, tokenizer: Any) -> None:
    prompt = tokenizer.encode(PROMPTS[3]).ids
    whole_pool = MAX_POSITIONS - len(prompt)  # reserves every block until it ends
    stream = Stream(llm_server)
    try:
        stream.send(tensor_inputs(prompt, whole_pool, streaming=True))
        for _ in range(3):
            _, error = stream.results.get(timeout=30)
            assert error is None, error
        wait_until_kv_blocks_are_used(llm_server)
    finally:
        stream.close(cancel=True)
    # left alone it would stream for over 20 s (about 3 ms a token here); cancelled, its
    # blocks come back at the executor's next iteration (the gauge follows within ~1 s)
    wait_for_kv_blocks(llm_server, "used", 0, timeout=10)
    wait_for_kv_blocks(llm_server, "free", NUM_BLOCKS, timeout=5)
    # and the model serves the next request
    r = generate(llm_server, "generate", {"text_input": PROMPTS[3], "max_tokens": 4})
    assert r.status_code == 200, r.text


def test_closed_generate_stream_frees_its_kv_blocks(llm_server: ShoalServer) -> None:
    body = {"text_input": PROMPTS[5], "max_tokens": MAX_POSITIONS - 16, "stream": True,
            "end_id": -1}  # no end id: left alone it would run for seconds
    with httpx.stream("POST", f"{llm_server.base}/v2/models/llm/generate_stream", json=body,
                      timeout=30) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # it runs
        wait_until_kv_blocks_are_used(llm_server)
    # leaving the block closed the connection: the client is gone
    wait_for_kv_blocks(llm_server, "used", 0, timeout=10)
    wait_for_kv_blocks(llm_server, "free", NUM_BLOCKS, timeout=5)


# ------------------------------------------------------------------ hostile requests


@pytest.mark.parametrize(("body", "field"), [
    ({"text_input": "", "max_tokens": 4}, "text_input"),
    ({"text_input": "Hello", "max_tokens": 0}, "max_tokens"),
    ({"text_input": "Hello", "max_tokens": 10**9}, "max_tokens"),
    ({"text_input": "Hello " * MAX_POSITIONS, "max_tokens": 1}, "text_input length"),
    ({"text_input": "Hello", "max_tokens": 4, "top_p": 2.0}, "top_p"),
    ({"text_input": "Hello", "max_tokens": 4, "request_output_len": 4}, "request_output_len"),
    # a JSON value of the wrong type: Triton's texts, which name no input
    ({"text_input": "Hello", "max_tokens": "many"}, "attempt to access JSON non-signed-integer"),
    ({"text_input": 7, "max_tokens": 4}, "attempt to access JSON non-string as string"),
    ({"max_tokens": 4}, "text_input"),
])
def test_hostile_generate_requests_are_refused(llm_server: ShoalServer, body: dict[str, Any],
                                               field: str) -> None:
    r = generate(llm_server, "generate", body)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]
    ok = generate(llm_server, "generate", {"text_input": "Hello", "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_hostile_tensor_requests_are_refused(llm_server: ShoalServer) -> None:
    stream = Stream(llm_server)
    try:
        wrong_dtype = grpcclient.InferInput("input_ids", [1, 3], "FP32")
        wrong_dtype.set_data_from_numpy(np.array([[5, 6, 7]], np.float32))
        out_len = grpcclient.InferInput("request_output_len", [1, 1], "INT32")
        out_len.set_data_from_numpy(np.array([[4]], np.int32))
        stream.send([wrong_dtype, out_len])
        _, error = stream.results.get(timeout=30)
        assert error is not None and "input_ids" in str(error)
        stream.send(tensor_inputs([5, 6, 7], 4, streaming=True, end_id=100000))
        _, error = stream.results.get(timeout=30)
        assert error is not None and "end_id" in str(error)
        stream.send(tensor_inputs([5, 6, 7], 0, streaming=True))
        _, error = stream.results.get(timeout=30)
        assert error is not None and "request_output_len" in str(error)
        stream.send(tensor_inputs([5, 6, 7], 4, streaming=True))  # the model keeps serving
        assert len(stream.tokens()) == 4
    finally:
        stream.close()
