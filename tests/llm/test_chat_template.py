"""Chat templates of a checkpoint: rendered as Hugging Face's ``apply_chat_template`` renders
them, found in ``tokenizer_config.json`` or ``chat_template.jinja``, absent -> None; the
``messages`` input of the text form and the count outputs."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np
import pytest

from shoal.errors import ShoalError
from shoal.llm import FinishReason
from shoal.llm.tiny_checkpoint import write_tokenizer, write_tokenizer_config
from shoal.workers.backends.base import BackendRequest
from shoal.workers.backends.llm.chat_template import load_chat_template, parse_messages
from shoal.workers.backends.llm.interface import TextCounts, parse_request, text_output

MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Grüß dich, 日本"},
            {"role": "assistant", "content": "Hi."},
            {"role": "user", "content": [{"type": "text", "text": "More"},
                                         {"type": "text", "text": " please"}]}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("tok")
    write_tokenizer(directory, "byte_level", 512)
    write_tokenizer_config(directory, "byte_level", chat_template=True)
    return directory


def test_render_equals_hugging_face(checkpoint: pathlib.Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(checkpoint)
    flat = [{**m, "content": "More please"} if isinstance(m["content"], list) else m
            for m in MESSAGES]
    template = load_chat_template(checkpoint)
    assert template is not None
    assert template.render(parse_messages(json.dumps(MESSAGES))) == \
        hf.apply_chat_template(flat, add_generation_prompt=True, tokenize=False)


def test_template_file_wins_and_missing_template_is_none(tmp_path: pathlib.Path) -> None:
    write_tokenizer_config(tmp_path, "byte_level", chat_template=False)
    assert load_chat_template(tmp_path) is None
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0].content }}")
    template = load_chat_template(tmp_path)
    assert template is not None
    assert template.render([{"role": "user", "content": "x"}]) == "<s>x"


def test_raise_exception_and_the_sandbox_refuse_with_invalid_arg(
        checkpoint: pathlib.Path, tmp_path: pathlib.Path) -> None:
    template = load_chat_template(checkpoint)
    assert template is not None
    with pytest.raises(ShoalError, match="Unknown role: tool"):
        template.render([{"role": "tool", "content": "x"}])
    (tmp_path / "chat_template.jinja").write_text("{{ ''.__class__.__mro__ }}")
    unsafe = load_chat_template(tmp_path)
    assert unsafe is not None
    with pytest.raises(ShoalError, match="messages"):
        unsafe.render([{"role": "user", "content": "x"}])


@pytest.mark.parametrize(("text", "message"), [
    ("[", "not JSON"), ("[]", "non-empty"), ('[{"content": "x"}]', "role"),
    ('[{"role": "user", "content": [{"type": "image_url"}]}]', "text parts"),
])
def test_bad_messages_name_the_input(text: str, message: str) -> None:
    with pytest.raises(ShoalError, match=message):
        parse_messages(text)


def _text_request(**inputs: Any) -> BackendRequest:
    return BackendRequest(1, {k: np.array([v.encode() if isinstance(v, str) else v],
                                           dtype=object if isinstance(v, str) else None)
                              for k, v in inputs.items()}, {}, [], {})


def test_messages_input_renders_then_tokenizes_without_special_tokens(
        checkpoint: pathlib.Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    template = load_chat_template(checkpoint)
    assert template is not None
    parsed = parse_request(_text_request(messages=json.dumps(MESSAGES[:2]), max_tokens=4),
                           batching=False, tokenizer=tokenizer, eos_token_id=2,
                           exclude_input=True, chat_template=template)
    rendered = template.render(MESSAGES[:2])
    assert parsed.text_form
    assert parsed.request.input_token_ids == tokenizer.encode(
        rendered, add_special_tokens=False).ids
    assert parsed.request.input_token_ids[0] == 1  # the template's bos
    with pytest.raises(ShoalError, match="has none"):
        parse_request(_text_request(messages=json.dumps(MESSAGES[:2])), batching=False,
                      tokenizer=tokenizer, eos_token_id=2, exclude_input=True)
    with pytest.raises(ShoalError, match="not both"):
        parse_request(_text_request(messages=json.dumps(MESSAGES[:2]), text_input="x"),
                      batching=False, tokenizer=tokenizer, eos_token_id=2,
                      exclude_input=True, chat_template=template)


def test_count_outputs_only_when_requested() -> None:
    counts = TextCounts(5, 3, FinishReason.END_ID)
    assert [t.name for t in text_output("a", batching=True, counts=counts)] == ["text_output"]
    outputs = {t.name: t.array for t in text_output(
        "a", batching=True, counts=counts,
        requested=("prompt_tokens", "completion_tokens", "finish_reason"))}
    assert outputs["prompt_tokens"].tolist() == [[5]]
    assert outputs["completion_tokens"].tolist() == [[3]]
    assert outputs["finish_reason"].tolist() == [[b"stop"]]
