"""The OpenAI request bodies: every field understood or refused naming it (400, OpenAI's shape),
limits, defaults; stop strings over streamed text."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from shoal.frontend.http.openai_api.errors import OpenAiError
from shoal.frontend.http.openai_api.params import (
    DEFAULT_CHAT_MAX_TOKENS,
    DEFAULT_MAX_TOKENS,
    MAX_N,
    parse_params,
)
from shoal.frontend.http.openai_api.stops import StopScanner

CHAT = [{"role": "user", "content": "hi"}]


def _parse(chat: bool = False, **body: Any) -> Any:
    base: dict[str, Any] = {"model": "llm", **({"messages": CHAT} if chat else {"prompt": "p"})}
    return parse_params(orjson.dumps({**base, **body}), chat=chat)


def test_defaults_and_off_values_are_accepted() -> None:
    params = _parse(logprobs=None, echo=False, tools=[], logit_bias={}, presence_penalty=0,
                    best_of=1, n=1, user="u")
    assert (params.max_tokens, params.temperature, params.top_p, params.n) == (
        DEFAULT_MAX_TOKENS, 1.0, 1.0, 1)
    assert _parse(chat=True).max_tokens == DEFAULT_CHAT_MAX_TOKENS
    assert _parse(chat=True, max_tokens=5, max_completion_tokens=7).max_tokens == 7
    assert _parse(stop="x").stop == ("x",)
    assert _parse(prompt=["one"]).prompt == "one"
    streaming = _parse(stream=True, stream_options={"include_usage": True})
    assert streaming.stream and streaming.include_usage


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"logprobs": 21}, "logprobs"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"whatever": 1}, "whatever"),
    ({"n": MAX_N + 1}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 2**40}, "max_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"seed": -1}, "seed"),
    ({"stop": ["a", ""]}, "stop"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": [1, 2]}, "prompt"),
    ({"model": ""}, "model"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
])
def test_refused_fields_are_named(body: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAiError) as raised:
        _parse(**body)
    assert (raised.value.status, raised.value.param) == (400, param)
    assert raised.value.document()["error"]["type"] == "invalid_request_error"


def test_chat_messages_are_checked() -> None:
    with pytest.raises(OpenAiError, match="tool / function"):
        _parse(chat=True, messages=[{"role": "assistant", "content": "",
                                     "tool_calls": [{"id": "1"}]}])
    with pytest.raises(OpenAiError) as raised:
        _parse(chat=True, messages=[{"role": "user", "content": [{"type": "image_url"}]}])
    assert raised.value.param == "messages[0].content"


def test_bad_json_is_refused() -> None:
    with pytest.raises(OpenAiError, match="not valid JSON"):
        parse_params(b"{", chat=False)


def test_stop_scanner_holds_back_possible_starts_and_cuts_at_the_first_stop() -> None:
    scanner = StopScanner(("END", "\n\n"))
    assert [scanner.push(p) for p in ["ab E", "N", "x E", "ND tail"]] == ["ab ", "", "ENx ", ""]
    assert scanner.stopped and scanner.flush() == ""
    scanner = StopScanner(("END",))
    assert scanner.push("abEN") == "ab" and scanner.flush() == "EN"
    assert StopScanner(()).push("anything") == "anything"
