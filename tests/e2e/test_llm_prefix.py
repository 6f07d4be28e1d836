"""Prefix caching (KV block reuse) and chunked context on a real server: the example's ``llm``
model on the tiny checkpoint of ``test_llm_serving.py``, with ``enable_chunked_context`` and a
small ``max_num_tokens`` so long prompts are prefilled in chunks. The same prompt twice through
the OpenAI API gives identical output, equal to Hugging Face greedy, and the second request is
served from reused blocks (``/metrics`` ``kv_cache_block_type="reused"`` and the statistics
document's ``shoal_llm``); a long prompt chunked while another request streams gives both their
greedy outputs."""

from __future__ import annotations

import pathlib
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import torch

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer
from tests.e2e.test_llm_serving import build_llm_model, kv_blocks

MAX_POSITIONS = 4096
TOKENS_PER_BLOCK = 32
MAX_NUM_TOKENS = 128  # a 600-token prompt takes 5 chunks
EOS = 2
SYSTEM = ("You are a careful assistant. Answer briefly, in plain words, and never invent "
          "facts. The quick brown fox jumps over the lazy dog while the cat sleeps. ")


@pytest.fixture(scope="module")
def prefix_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    repo = tmp_path_factory.mktemp("llm-prefix-repo")
    config = build_llm_model(repo, MAX_POSITIONS)
    config, count = re.subn(r'"max_num_tokens" value: \{ string_value: "\d+" \}',
                            f'"max_num_tokens" value: {{ string_value: "{MAX_NUM_TOKENS}" }}',
                            config)
    assert count == 1
    config += ('parameters { key: "enable_chunked_context" value: { string_value: "true" } }\n'
               'parameters { key: "enable_kv_cache_reuse" value: { string_value: "true" } }\n'
               f'parameters {{ key: "kv_cache_tokens_per_block" '
               f'value: {{ string_value: "{TOKENS_PER_BLOCK}" }} }}\n')
    (repo / "llm" / "config.pbtxt").write_text(config)
    return repo


@pytest.fixture(scope="module")
def prefix_server(prefix_repo: pathlib.Path) -> Iterator[ShoalServer]:
    with serving(ShoalServer([str(prefix_repo)])) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(prefix_server: ShoalServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{prefix_server.base}/v1", api_key="unused", max_retries=0,
                       timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def tokenizer(prefix_repo: pathlib.Path) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(prefix_repo / "llm" / "checkpoint" / "tokenizer.json"))


@pytest.fixture(scope="module")
def hf_model(prefix_repo: pathlib.Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(prefix_repo / "llm" / "checkpoint")


def hf_text(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int) -> str:
    ids = tokenizer.encode(prompt).ids
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=0, eos_token_id=EOS)
    generated = out[0, len(ids):].tolist()
    if EOS in generated:
        generated = generated[:generated.index(EOS)]
    text: str = tokenizer.decode(generated)
    return text


def reused_in_stats(server: ShoalServer) -> int:
    """The statistics' reused-block count; the figures arrive with the worker's first heartbeat
    after the load, so a fresh server's document may lack them for up to a second."""
    deadline = time.monotonic() + 10
    while True:
        r = httpx.get(f"{server.base}/v2/models/llm/stats", timeout=10)
        assert r.status_code == 200, r.text
        (entry,) = r.json()["model_stats"]
        if "shoal_llm" in entry:
            return int(entry["shoal_llm"]["kv_cache"]["reused_blocks"])
        assert time.monotonic() < deadline, f"no shoal_llm figures in {entry}"
        time.sleep(0.1)


def wait_for_reused(server: ShoalServer, at_least: int) -> tuple[float, int]:
    """Both views of the reused-block counter once they reach ``at_least`` (the worker's
    figures reach the broker on its 1 s heartbeat)."""
    deadline = time.monotonic() + 10
    while True:
        gauge, stats = kv_blocks(server, "reused") or 0.0, reused_in_stats(server)
        if gauge >= at_least and stats >= at_least:
            return gauge, stats
        assert time.monotonic() < deadline, f"reused blocks: /metrics {gauge}, stats {stats}"
        time.sleep(0.1)


def test_same_prompt_twice_is_identical_and_reuses_blocks(
        prefix_server: ShoalServer, client: openai.OpenAI, tokenizer: Any,
        hf_model: Any) -> None:
    prompt = SYSTEM * 8 + "Question: what sleeps?"
    length = len(tokenizer.encode(prompt).ids)
    assert length > 6 * TOKENS_PER_BLOCK
    before = reused_in_stats(prefix_server)
    first = client.completions.create(model="llm", prompt=prompt, max_tokens=12,
                                      temperature=0)
    second = client.completions.create(model="llm", prompt=prompt, max_tokens=12,
                                       temperature=0)
    assert first.choices[0].text == second.choices[0].text == hf_text(
        hf_model, tokenizer, prompt, 12)
    # every full block but the one holding the last prompt token came from the cache
    wait_for_reused(prefix_server, before + (length - 1) // TOKENS_PER_BLOCK)
    # a different question after the same system prompt reuses the shared blocks only
    other = SYSTEM * 8 + "Question: who jumps?"
    third = client.completions.create(model="llm", prompt=other, max_tokens=12, temperature=0)
    assert third.choices[0].text == hf_text(hf_model, tokenizer, other, 12)


def test_chunked_long_prompt_while_another_request_streams(
        client: openai.OpenAI, tokenizer: Any, hf_model: Any) -> None:
    long_prompt = "A different document. " + SYSTEM * 14
    assert len(tokenizer.encode(long_prompt).ids) > 4 * MAX_NUM_TOKENS
    short_prompt = "Hello world"
    streamed: list[str] = []

    def stream() -> None:
        for chunk in client.completions.create(model="llm", prompt=short_prompt, max_tokens=48,
                                               temperature=0, stream=True):
            streamed.append(chunk.choices[0].text)

    streamer = threading.Thread(target=stream)
    streamer.start()
    long = client.completions.create(model="llm", prompt=long_prompt, max_tokens=8,
                                     temperature=0)
    streamer.join(timeout=120)
    assert not streamer.is_alive()
    assert long.choices[0].text == hf_text(hf_model, tokenizer, long_prompt, 8)
    assert "".join(streamed) == hf_text(hf_model, tokenizer, short_prompt, 48)
