"""The OpenAI-compatible API on a real server, driven by the real ``openai`` client: the example
repository's ``llm`` model (the tiny checkpoint of ``test_llm_serving.py``). Greedy completions
equal Hugging Face ``generate``; chat equals HF ``apply_chat_template`` + ``generate``; streamed
chunks concatenate to the non-streamed text; ``usage`` counts the tokens; stop strings cut the
text; ``n`` gives independent choices; hostile requests get OpenAI-shaped 4xx and the model
keeps serving; a client that leaves a stream frees its KV blocks."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import torch

from tests.e2e.server import ShoalServer
from tests.e2e.test_llm_serving import (  # noqa: F401  (module fixtures, shared)
    EOS,
    NUM_BLOCKS,
    PROMPTS,
    hf_model,
    llm_repo,
    llm_server,
    tokenizer,
    wait_for_kv_blocks,
    wait_until_kv_blocks_are_used,
)

CHAT: Any = [{"role": "system", "content": "You are terse."},
             {"role": "user", "content": "Hello world, café?"}]


@pytest.fixture(scope="module")
def client(llm_server: ShoalServer) -> Iterator[openai.OpenAI]:  # noqa: F811
    with openai.OpenAI(base_url=f"{llm_server.base}/v1", api_key="unused", max_retries=0,
                       timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def hf_tokenizer(llm_repo: pathlib.Path) -> Any:  # noqa: F811
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(llm_repo / "llm" / "checkpoint")


def hf_generated(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Hugging Face greedy continuation, the end token (if produced) included."""
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=0, eos_token_id=EOS)
    generated: list[int] = out[0, len(prompt):].tolist()
    return generated[:generated.index(EOS) + 1] if EOS in generated else generated


def decoded(tokenizer: Any, tokens: list[int]) -> str:  # noqa: F811
    text: str = tokenizer.decode([t for t in tokens if t != EOS])
    return text


# ------------------------------------------------------------------ models


def test_models_lists_the_llm_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["llm"]
    assert client.models.retrieve("llm").owned_by == "shoal"


# ------------------------------------------------------------------ greedy == Hugging Face


def test_completion_equals_hf_greedy_and_counts_usage(
        client: openai.OpenAI, tokenizer: Any, hf_model: Any) -> None:  # noqa: F811
    prompt = PROMPTS[0]
    ids = tokenizer.encode(prompt).ids
    expected = hf_generated(hf_model, ids, 12)
    r = client.completions.create(model="llm", prompt=prompt, max_tokens=12, temperature=0)
    assert r.object == "text_completion" and r.model == "llm"
    assert r.choices[0].text == decoded(tokenizer, expected)
    assert r.choices[0].finish_reason == ("stop" if expected[-1] == EOS else "length")
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), len(expected))
    assert r.usage.total_tokens == len(ids) + len(expected)


def test_chat_equals_hf_chat_template_and_greedy(
        client: openai.OpenAI, tokenizer: Any, hf_tokenizer: Any,  # noqa: F811
        hf_model: Any) -> None:  # noqa: F811
    ids = hf_tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    expected = hf_generated(hf_model, list(ids), 16)
    r = client.chat.completions.create(model="llm", messages=CHAT,
                                       max_completion_tokens=16, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == decoded(tokenizer, expected)
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), len(expected))


# ------------------------------------------------------------------ streaming


def test_streamed_completion_concatenates_to_the_whole(client: openai.OpenAI) -> None:
    prompt = PROMPTS[2]  # multi-byte characters
    whole = client.completions.create(model="llm", prompt=prompt, max_tokens=24, temperature=0)
    chunks = list(client.completions.create(model="llm", prompt=prompt, max_tokens=24,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == whole.choices[0].text
    assert len(texts) > 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == \
        whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_streamed_chat_concatenates_to_the_whole(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="llm", messages=CHAT,
                                           max_tokens=20, temperature=0)
    chunks: list[Any] = list(client.chat.completions.create(
        model="llm", messages=CHAT, max_tokens=20, temperature=0,
        stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


# ------------------------------------------------------------------ stop, n, seed


def test_stop_string_cuts_the_text_streaming_or_not(client: openai.OpenAI) -> None:
    full = client.completions.create(model="llm", prompt=PROMPTS[3], max_tokens=24,
                                     temperature=0).choices[0].text
    stop = full[len(full) // 2:len(full) // 2 + 2]
    assert stop and len(full) > 4, full
    expected = full[:full.index(stop)]
    r = client.completions.create(model="llm", prompt=PROMPTS[3], max_tokens=24,
                                  temperature=0, stop=[stop, "\x00never"])
    assert (r.choices[0].text, r.choices[0].finish_reason) == (expected, "stop")
    chunks = list(client.completions.create(model="llm", prompt=PROMPTS[3], max_tokens=24,
                                            temperature=0, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_n_choices_are_independent_and_seeded(client: openai.OpenAI) -> None:
    def sample() -> Any:
        return client.completions.create(model="llm", prompt=PROMPTS[1], max_tokens=8,
                                         temperature=1.0, n=3, seed=7)

    first, again = sample(), sample()
    assert sorted(c.index for c in first.choices) == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]  # seeded
    assert len({c.text for c in first.choices}) > 1  # each choice samples on its own
    assert first.usage is not None and first.usage.completion_tokens > 8


# ------------------------------------------------------------------ hostile requests


@pytest.mark.parametrize(("route", "body", "status", "param"), [
    ("completions", {"model": "llm", "prompt": ""}, 400, "prompt"),
    ("completions", {"model": "llm", "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("completions", {"model": "llm", "prompt": "hi", "max_tokens": 10**9}, 400, "max_tokens"),
    ("completions", {"model": "nope", "prompt": "hi"}, 404, "model"),
    ("completions", {"model": "llm", "prompt": "hi", "n": 9}, 400, "n"),
    ("completions", {"model": "llm", "prompt": "hi", "logit_bias": {"5": 1}}, 400,
     "logit_bias"),
    ("completions", {"model": "llm", "prompt": "hi", "temperature": 3}, 400, "temperature"),
    ("completions", {"model": "llm", "prompt": "hi", "bogus": 1}, 400, "bogus"),
    ("chat/completions", {"model": "llm", "messages": [{"role": "user", "content": "hi"}],
                          "tools": [{"type": "function", "function": {"name": "f"}}]},
     400, "tools"),
    ("chat/completions", {"model": "llm", "messages": []}, 400, "messages"),
    ("chat/completions", {"model": "llm", "messages": [{"role": "tool", "content": "x"}]},
     400, "messages[0].role"),
])
def test_hostile_requests_get_openai_errors(llm_server: ShoalServer, route: str,  # noqa: F811
                                            body: dict[str, Any], status: int,
                                            param: str) -> None:
    r = httpx.post(f"{llm_server.base}/v1/{route}", json=body, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"]
    assert error["type"] == "invalid_request_error"
    if status == 404:
        assert error["code"] == "model_not_found"


def test_prompt_longer_than_the_context_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="exceeds the maximum sequence length"):
        client.completions.create(model="llm", prompt="x " * 9000, max_tokens=4)


def test_bad_json_is_400_and_the_model_keeps_serving(llm_server: ShoalServer,  # noqa: F811
                                                     client: openai.OpenAI) -> None:
    r = httpx.post(f"{llm_server.base}/v1/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="missing", prompt="hi")
    r2 = client.completions.create(model="llm", prompt=PROMPTS[4], max_tokens=4, temperature=0)
    assert r2.usage is not None and r2.usage.prompt_tokens > 0


# ------------------------------------------------------------------ disconnect


def test_leaving_a_stream_frees_its_kv_blocks(llm_server: ShoalServer) -> None:  # noqa: F811
    body = {"model": "llm", "prompt": PROMPTS[5], "max_tokens": 4000, "temperature": 0,
            "stream": True}
    with httpx.stream("POST", f"{llm_server.base}/v1/completions", json=body,
                      timeout=30) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # it runs
        wait_until_kv_blocks_are_used(llm_server)
    wait_for_kv_blocks(llm_server, "used", 0, timeout=10)
    wait_for_kv_blocks(llm_server, "free", NUM_BLOCKS, timeout=5)
