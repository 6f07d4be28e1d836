"""Logits post-processors, penalties and log-probabilities on a real server: the example
repository's ``llm`` model (the tiny checkpoint of ``test_llm_serving.py``) with a
``processors.py`` in its folder. A processor that bans a token is obeyed (tensor form, token
ids); the batched processor sees each request once per chosen token; a raising processor fails
only its request; an unknown name is a 400 naming ``logits_processor``; ``logprobs`` /
``top_logprobs`` have OpenAI's shapes and Hugging Face's values; penalties change the output."""

from __future__ import annotations

import json
import pathlib
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest
import torch
import tritonclient.grpc as grpcclient

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer
from tests.e2e.test_llm_serving import (  # noqa: F401  (module fixtures, shared)
    PROMPTS,
    Stream,
    hf_model,
    llm_repo,
    tensor_inputs,
    tokenizer,
)

# the module's server loads torch and a checkpoint: under a busy machine's load its start and
# the first test's setup take longer than the suite's defaults
pytestmark = pytest.mark.timeout(300)
START_TIMEOUT_S = 180.0


class _PatientServer(ShoalServer):
    def start(self, wait_ready: bool = True, timeout: float = START_TIMEOUT_S) -> ShoalServer:
        return super().start(wait_ready, timeout)


PROCESSORS = """
import json
import pathlib

BANNED = pathlib.Path({banned!r})  # the token id to ban, written by the test
LOG = {log!r}

def ban(req_id, logits, ids, stream_ptr, client_id):
    logits[:, int(BANNED.read_text())] = float("-inf")

def boom(req_id, logits, ids, stream_ptr, client_id):
    raise RuntimeError("processor bug")

def batched(req_ids, logits, ids, stream_ptr, client_ids):
    with open(LOG, "a") as log:
        log.write(json.dumps(list(req_ids)) + "\\n")

processor_map = {{"ban": ban, "boom": boom}}
processor_batched = batched
"""


@pytest.fixture(scope="module")
def batched_log(llm_repo: pathlib.Path) -> pathlib.Path:  # noqa: F811
    return llm_repo / "batched.log"


@pytest.fixture(scope="module")
def logits_server(llm_repo: pathlib.Path,  # noqa: F811
                  batched_log: pathlib.Path) -> Iterator[ShoalServer]:
    model = llm_repo / "llm"
    (model / "processors.py").write_text(
        PROCESSORS.format(banned=str(llm_repo / "banned.txt"), log=str(batched_log)))
    config = (model / "config.pbtxt").read_text()
    (model / "config.pbtxt").write_text(
        config + 'parameters { key: "logits_post_processors" '
                 'value: { string_value: "processors.py" } }\n')
    with serving(_PatientServer([str(llm_repo)])) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(logits_server: ShoalServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{logits_server.base}/v1", api_key="unused", max_retries=0,
                       timeout=60) as c:
        yield c


def stream_tokens(server: ShoalServer, prompt: list[int], max_tokens: int,
                  processor: str | None) -> list[int]:
    """Greedy tokens through the tensor form (tritonclient gRPC stream)."""
    inputs = tensor_inputs(prompt, max_tokens, False)
    if processor is not None:
        name = grpcclient.InferInput("logits_post_processor_name", [1, 1], "BYTES")
        name.set_data_from_numpy(np.array([[processor.encode()]], dtype=np.object_))
        inputs.append(name)
    stream = Stream(server)
    try:
        stream.send(inputs)
        return stream.tokens()
    finally:
        stream.close()


# ------------------------------------------------------------------ post-processors


def test_a_processor_that_bans_a_token_is_obeyed(logits_server: ShoalServer,
                                                  llm_repo: pathlib.Path,  # noqa: F811
                                                  tokenizer: Any) -> None:  # noqa: F811
    prompt = tokenizer.encode(PROMPTS[0]).ids
    free = stream_tokens(logits_server, prompt, 10, None)
    (llm_repo / "banned.txt").write_text(str(free[0]))  # the token greedy picks first
    banned = stream_tokens(logits_server, prompt, 10, "ban")
    assert len(banned) == 10 and free[0] not in banned
    assert banned[0] != free[0]


def test_the_batched_processor_sees_each_request_once_per_chosen_token(
        client: openai.OpenAI, batched_log: pathlib.Path) -> None:
    batched_log.unlink(missing_ok=True)
    usages: list[int] = []

    def run(prompt: str) -> None:
        r = client.completions.create(model="llm", prompt=prompt, max_tokens=8, temperature=0,
                                      extra_body={"logits_processor": "batched"})
        assert r.usage is not None
        usages.append(r.usage.completion_tokens)

    threads = [threading.Thread(target=run, args=(p,)) for p in PROMPTS[:2]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    calls = [json.loads(line) for line in batched_log.read_text().splitlines()]
    assert all(len(ids) == len(set(ids)) for ids in calls)
    per_request = Counter(i for ids in calls for i in ids)
    assert sorted(per_request.values()) == sorted(usages)


def test_a_raising_processor_fails_only_its_request(client: openai.OpenAI) -> None:
    results: dict[str, Any] = {}

    def run(name: str, extra: dict[str, Any]) -> None:
        try:
            results[name] = client.completions.create(
                model="llm", prompt=PROMPTS[1], max_tokens=12, temperature=0, extra_body=extra)
        except openai.APIStatusError as error:
            results[name] = error

    threads = [threading.Thread(target=run, args=("boom", {"logits_processor": "boom"})),
               threading.Thread(target=run, args=("plain", {}))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = results["boom"]
    assert isinstance(failed, openai.InternalServerError)
    assert "logits post-processor 'boom' failed: RuntimeError: processor bug" in str(failed)
    plain = results["plain"]
    assert isinstance(plain, openai.types.Completion) and plain.usage is not None
    assert plain.usage.completion_tokens > 0
    again = client.completions.create(model="llm", prompt=PROMPTS[1], max_tokens=12,
                                      temperature=0)
    assert again.choices[0].text == plain.choices[0].text


def test_an_unknown_processor_name_is_a_400_naming_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="llm", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=4, extra_body={"logits_processor": "nope"})
    assert raised.value.status_code == 400
    error: Any = raised.value.body
    assert isinstance(error, dict) and error["param"] == "logits_processor"
    assert "'nope' is not a logits post-processor" in error["message"]


# ------------------------------------------------------------------ log-probabilities


def test_chat_logprobs_match_hugging_face_and_stream_the_same(
        client: openai.OpenAI, tokenizer: Any, hf_model: Any) -> None:  # noqa: F811
    from transformers import AutoTokenizer

    messages: Any = [{"role": "user", "content": PROMPTS[4]}]
    hf_tokenizer = AutoTokenizer.from_pretrained(hf_model.name_or_path)
    ids = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    r = client.chat.completions.create(model="llm", messages=messages, max_tokens=8,
                                       temperature=0, logprobs=True, top_logprobs=5)
    logprobs = r.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None and r.usage is not None
    content = logprobs.content
    ended = r.choices[0].finish_reason == "stop"
    assert len(content) == r.usage.completion_tokens - ended  # the end token has none
    for entry in content:
        assert len(entry.top_logprobs) == 5
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-6)
        assert entry.bytes is not None
    with torch.inference_mode():
        logits = hf_model(torch.tensor([ids])).logits[0, -1]
    expected = torch.log_softmax(logits, dim=-1).topk(5)
    first = content[0].top_logprobs
    assert [a.logprob for a in first] == pytest.approx(expected.values.tolist(), abs=1e-4)
    assert [a.token for a in first] == [tokenizer.decode([t]) for t in expected.indices.tolist()]
    chunks = list(client.chat.completions.create(
        model="llm", messages=messages, max_tokens=8, temperature=0, logprobs=True,
        top_logprobs=5, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content or []]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]


def test_completion_logprobs_shape(client: openai.OpenAI) -> None:
    r = client.completions.create(model="llm", prompt=PROMPTS[3], max_tokens=6, temperature=0,
                                  logprobs=2)
    logprobs = r.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert logprobs.token_logprobs is not None and logprobs.top_logprobs is not None
    assert logprobs.text_offset is not None
    count = len(logprobs.tokens)
    assert count == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) > 0
    offsets = [sum(len(t) for t in logprobs.tokens[:i]) for i in range(count)]
    assert logprobs.text_offset == offsets
    for token, log_prob, top in zip(logprobs.tokens, logprobs.token_logprobs,
                                    logprobs.top_logprobs, strict=True):
        assert top[token] == pytest.approx(log_prob) and len(top) <= 3
        assert max(top.values()) == pytest.approx(log_prob)  # greedy: the most likely


def test_penalties_change_the_output(client: openai.OpenAI) -> None:
    def text(presence: float = 0.0, frequency: float = 0.0) -> str:
        r = client.completions.create(model="llm", prompt=PROMPTS[0], max_tokens=24,
                                      temperature=0, presence_penalty=presence,
                                      frequency_penalty=frequency)
        return str(r.choices[0].text)

    plain = text()
    assert text(frequency=2.0) != plain
    assert text(presence=2.0) != plain
    assert text() == plain
