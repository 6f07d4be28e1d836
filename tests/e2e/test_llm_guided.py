"""Guided decoding on a real server (the example ``llm`` model, random weights): OpenAI
``response_format`` json_schema outputs parse and validate, json_object outputs that end parse,
a regex-guided output (Triton generate, text form) fullmatches its regex, an EBNF-guided output
(tritonclient gRPC, tensor form) parses by its grammar, guided and free requests in flight
together both come out right, a guided output cut by max_tokens says ``length``, and a bad
schema / regex / grammar is a 400 naming the field while the model keeps serving."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema  # type: ignore[import-untyped]
import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.server import ShoalServer
from tests.e2e.test_llm_serving import (  # noqa: F401  (module fixtures, shared)
    EOS,
    Stream,
    generate,
    llm_repo,
    llm_server,
    tensor_inputs,
    tokenizer,
)

pytest.importorskip("xgrammar")

SCHEMA = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 999},
    "ok": {"type": "boolean"},
    "color": {"enum": ["red", "green", "blue"]}},
    "required": ["id", "ok", "color"]}
JSON_SCHEMA_FORMAT: Any = {"type": "json_schema", "json_schema": {
    "name": "item", "schema": SCHEMA, "strict": True}}
REGEX = r"[a-z]{3}-[0-9]{2}"
EBNF = '''root ::= pair | "[" pair ("," pair)? "]"
pair ::= key "=" value
key ::= "x" | "y"
value ::= [0-9] [0-9]?'''
PAIR = r"[xy]=[0-9]{1,2}"
PAIRS = rf"{PAIR}|\[{PAIR}(?:,{PAIR})?\]"
CHAT: Any = [{"role": "user", "content": "Describe one item as JSON."}]


@pytest.fixture(scope="module")
def client(llm_server: ShoalServer) -> Iterator[openai.OpenAI]:  # noqa: F811
    with openai.OpenAI(base_url=f"{llm_server.base}/v1", api_key="unused", max_retries=0,
                       timeout=60) as c:
        yield c


def guided_body(prompt: str, guide_type: str, guide: str | None = None,
                **fields: Any) -> dict[str, Any]:
    body = {"text_input": prompt, "max_tokens": 64, "guided_decoding_guide_type": guide_type,
            **fields}
    return body if guide is None else body | {"guided_decoding_guide": guide}


# ------------------------------------------------------------------ outputs follow the guide


def test_chat_json_schema_outputs_parse_and_validate(client: openai.OpenAI) -> None:
    greedy = client.chat.completions.create(model="llm", messages=CHAT, temperature=0,
                                            max_completion_tokens=80,
                                            response_format=JSON_SCHEMA_FORMAT)
    sampled = client.chat.completions.create(model="llm", messages=CHAT, n=6, seed=11,
                                             max_completion_tokens=80,
                                             response_format=JSON_SCHEMA_FORMAT)
    choices = [*greedy.choices, *sampled.choices]
    for choice in choices:
        assert choice.finish_reason == "stop"
        content = choice.message.content
        assert content is not None
        jsonschema.validate(json.loads(content), SCHEMA)
    assert len({c.message.content for c in choices}) > 1


def test_streamed_completion_json_schema_validates(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model="llm", prompt="An item:", max_tokens=80,
                                            seed=5, stream=True,
                                            extra_body={"response_format": JSON_SCHEMA_FORMAT}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_outputs_that_end_parse(client: openai.OpenAI) -> None:
    """Any JSON: a random model can wander inside a string until max_tokens (finish_reason
    length, text cut); every choice that ends on its own parses."""
    r = client.completions.create(model="llm", prompt="JSON:", max_tokens=160, n=8, seed=1,
                                  extra_body={"response_format": {"type": "json_object"}})
    ended = [c.text for c in r.choices if c.finish_reason == "stop"]
    assert ended, [c.text for c in r.choices]
    for text in ended:
        assert isinstance(json.loads(text), dict | list)


def test_generate_regex_fullmatches(llm_server: ShoalServer) -> None:  # noqa: F811
    for seed in range(4):
        r = generate(llm_server, "generate", guided_body(
            "Code:", "regex", REGEX, temperature=1.0, top_k=0, random_seed=seed))
        assert r.status_code == 200, r.text
        assert re.fullmatch(REGEX, r.json()["text_output"]), r.json()


def test_tensor_form_ebnf_parses_by_the_grammar(llm_server: ShoalServer,  # noqa: F811
                                                tokenizer: Any) -> None:  # noqa: F811
    prompt = tokenizer.encode("Pairs:").ids
    stream = Stream(llm_server)
    try:
        for seed in range(3):
            inputs = tensor_inputs(prompt, 32, True, end_id=EOS)
            for name, value in (("guided_decoding_guide_type", "ebnf_grammar"),
                                ("guided_decoding_guide", EBNF)):
                tensor = grpcclient.InferInput(name, [1, 1], "BYTES")
                tensor.set_data_from_numpy(np.array([[value.encode()]], dtype=np.object_))
                inputs.append(tensor)
            seed_input = grpcclient.InferInput("random_seed", [1, 1], "UINT64")
            seed_input.set_data_from_numpy(np.array([[seed]], np.uint64))
            top_p = grpcclient.InferInput("runtime_top_p", [1, 1], "FP32")
            top_p.set_data_from_numpy(np.array([[1.0]], np.float32))
            stream.send([*inputs, seed_input, top_p])
            text = tokenizer.decode(stream.tokens())
            assert re.fullmatch(PAIRS, text), text
    finally:
        stream.close()


def test_guided_and_free_requests_in_flight_together(llm_server: ShoalServer) -> None:  # noqa: F811
    free = {"text_input": "The quick brown fox", "max_tokens": 48, "stream": True}
    alone = generate(llm_server, "generate_stream", free)
    assert alone.status_code == 200, alone.text
    guided = guided_body("An item:", "json_schema", json.dumps(SCHEMA), max_tokens=80,
                         stream=True)
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda body: generate(llm_server, "generate_stream", body),
                                [free, guided, free, guided, free, guided]))
    for index, answer in enumerate(answers):
        assert answer.status_code == 200, answer.text
        if index % 2:
            jsonschema.validate(json.loads(_sse_text(answer)), SCHEMA)
        else:
            assert _sse_text(answer) == _sse_text(alone)


def _sse_text(response: httpx.Response) -> str:
    events = [c for c in response.content.split(b"\n\n") if c.startswith(b"data: ")]
    return "".join(json.loads(e[len(b"data: "):])["text_output"] for e in events)


def test_output_cut_by_max_tokens_says_length(client: openai.OpenAI) -> None:
    r = client.completions.create(model="llm", prompt="An item:", max_tokens=3, temperature=0,
                                  extra_body={"response_format": JSON_SCHEMA_FORMAT})
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].text.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.choices[0].text)


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(("response_format", "message"), [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}},
     "invalid JSON schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}, "invalid JSON schema"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema"),
    ({"type": "yaml"}, "response_format.type"),
])
def test_bad_response_format_is_400_naming_it(client: openai.OpenAI, response_format: Any,
                                              message: str) -> None:
    with pytest.raises(openai.BadRequestError, match=re.escape(message)) as raised:
        client.chat.completions.create(model="llm", messages=CHAT, max_completion_tokens=8,
                                       response_format=response_format)
    assert raised.value.status_code == 400
    body: Any = raised.value.body
    assert body["param"].startswith("response_format")
    assert ".cc:" not in body["message"]


def test_bad_guides_are_400_and_the_model_keeps_serving(
        llm_server: ShoalServer, client: openai.OpenAI) -> None:  # noqa: F811
    for body, message in (
            (guided_body("x", "regex", "[a-"), "invalid regular expression"),
            (guided_body("x", "ebnf_grammar", "root ::= nowhere"), "invalid EBNF grammar"),
            (guided_body("x", "json_schema", "{"), "invalid JSON schema"),
            (guided_body("x", "xml"), "guided_decoding_guide_type"),
            (guided_body("x", "regex"), "guided_decoding_guide"),
            (guided_body("x", "json", bad_words=["x"]), "cannot be combined with bad_words"),
            # a guide over the size its compile may take is refused before it is compiled
            (guided_body("x", "regex", "(" + "|".join(f"w{i}" for i in range(20_000)) + ")"),
             "over the limit of 65536 bytes")):
        r = generate(llm_server, "generate", body)
        assert r.status_code == 400, r.text
        assert message in r.json()["error"], r.json()
    ok = client.completions.create(model="llm", prompt="Code:", max_tokens=16,
                                   extra_body={"response_format": {"type": "json_object"}})
    assert ok.choices[0].text.startswith(("{", "["))
    r = generate(llm_server, "generate", guided_body("Code:", "regex", REGEX))
    assert r.status_code == 200 and re.fullmatch(REGEX, r.json()["text_output"])
