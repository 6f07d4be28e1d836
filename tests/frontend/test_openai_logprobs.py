"""The OpenAI sampling fields of ``openai_api/logprobs.py``: penalties, ``logprobs`` /
``top_logprobs`` and ``logits_processor`` parsed (or refused naming the field) into backend
inputs, and ``token_logprobs`` entries shaped as OpenAI's chat and completions ``logprobs``."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from shoal.frontend.http.openai_api.errors import OpenAiError
from shoal.frontend.http.openai_api.logprobs import LogprobsShaper, SamplingExtras
from shoal.frontend.http.openai_api.params import parse_params

CHAT = [{"role": "user", "content": "hi"}]


def _parse(chat: bool = False, **body: Any) -> Any:
    base: dict[str, Any] = {"model": "llm", **({"messages": CHAT} if chat else {"prompt": "p"})}
    return parse_params(orjson.dumps({**base, **body}), chat=chat)


def test_fields_become_backend_inputs() -> None:
    extras = _parse(chat=True, presence_penalty=0.5, frequency_penalty=-1, logprobs=True,
                    top_logprobs=3, logits_processor="ban").extras
    assert extras == SamplingExtras(0.5, -1.0, True, 3, "ban")
    assert extras.backend_inputs() == {
        "presence_penalty": 0.5, "frequency_penalty": -1.0, "num_top_log_probs": 3,
        "logits_post_processor_name": "ban"}
    assert extras.needed()[1] == ["token_logprobs"]
    completion = _parse(logprobs=2).extras
    assert (completion.logprobs, completion.top_logprobs) == (True, 2)
    assert _parse(logprobs=0).extras.logprobs
    off = _parse(chat=True, logprobs=False, presence_penalty=0).extras
    assert off == SamplingExtras() and off.backend_inputs() == {} and off.needed() == ([], [])


@pytest.mark.parametrize(("chat", "body", "param"), [
    (True, {"logprobs": 1}, "logprobs"),
    (True, {"top_logprobs": 2}, "top_logprobs"),
    (True, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (False, {"logprobs": True}, "logprobs"),
    (False, {"logprobs": -1}, "logprobs"),
    (False, {"top_logprobs": 1}, "top_logprobs"),
    (False, {"presence_penalty": -2.5}, "presence_penalty"),
    (True, {"frequency_penalty": "1"}, "frequency_penalty"),
    (True, {"logits_processor": ""}, "logits_processor"),
    (False, {"logits_processor": ["a"]}, "logits_processor"),
])
def test_bad_values_are_refused_naming_the_field(chat: bool, body: dict[str, Any],
                                                 param: str) -> None:
    with pytest.raises(OpenAiError) as raised:
        _parse(chat=chat, **body)
    assert (raised.value.status, raised.value.param) == (400, param)


ENTRIES = [
    {"token": "He", "bytes": [72, 101], "logprob": -0.5,
     "top_logprobs": [{"token": "He", "bytes": [72, 101], "logprob": -0.5},
                      {"token": "A", "bytes": [65], "logprob": -1.5}]},
    {"token": "llo", "bytes": [108, 108, 111], "logprob": -2.0,
     "top_logprobs": [{"token": "y", "bytes": [121], "logprob": -1.0}]},
]


def test_chat_logprobs_hold_the_entries_as_content() -> None:
    shaper = LogprobsShaper(SamplingExtras(logprobs=True, top_logprobs=2), chat=True, n=1)
    assert shaper.document(0, ENTRIES) == {"content": ENTRIES, "refusal": None}
    assert shaper.document(0, None) is None
    assert LogprobsShaper(SamplingExtras(), chat=True, n=1).document(0, ENTRIES) is None


def test_completion_logprobs_keep_text_offsets_across_chunks() -> None:
    shaper = LogprobsShaper(SamplingExtras(logprobs=True, top_logprobs=1), chat=False, n=2)
    first = shaper.document(1, ENTRIES[:1])
    second = shaper.document(1, ENTRIES[1:])
    assert first == {"tokens": ["He"], "token_logprobs": [-0.5],
                     "top_logprobs": [{"He": -0.5, "A": -1.5}], "text_offset": [0]}
    assert second == {"tokens": ["llo"], "token_logprobs": [-2.0],
                      "top_logprobs": [{"y": -1.0, "llo": -2.0}], "text_offset": [2]}
    assert shaper.document(0, ENTRIES)["text_offset"] == [0, 2]  # type: ignore[index]


def test_completion_top_logprobs_keep_the_chosen_tokens_value_when_texts_collide() -> None:
    entry = {"token": "\ufffd", "bytes": [0xE6], "logprob": -2.0,
             "top_logprobs": [{"token": "a", "bytes": [97], "logprob": -0.5},
                              {"token": "\ufffd", "bytes": [0xE7], "logprob": -1.0}]}
    shaper = LogprobsShaper(SamplingExtras(logprobs=True, top_logprobs=2), chat=False, n=1)
    document = shaper.document(0, [entry])
    assert document is not None
    assert document["top_logprobs"] == [{"\ufffd": -2.0, "a": -0.5}]
