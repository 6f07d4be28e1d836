"""OpenAI's ``response_format`` -> the backend's guided decoding inputs: each accepted shape and
the guide it becomes, each malformed one refused with a 400 naming the field."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from shoal.frontend.http.openai_api.errors import OpenAiError
from shoal.frontend.http.openai_api.params import parse_params
from shoal.frontend.http.openai_api.response_format import Guide, openai_message

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _guide(response_format: Any, chat: bool = True) -> Guide | None:
    body: dict[str, Any] = {"model": "llm", "response_format": response_format}
    body |= {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "p"}
    return parse_params(orjson.dumps(body), chat=chat).guide


@pytest.mark.parametrize("chat", [True, False])
def test_text_json_object_and_json_schema_become_guides(chat: bool) -> None:
    assert _guide(None, chat) is None
    assert _guide({"type": "text"}, chat) is None
    assert _guide({"type": "json_object"}, chat) == Guide("json")
    guide = _guide({"type": "json_schema", "json_schema": {
        "name": "answer", "schema": SCHEMA, "strict": True, "description": "d"}}, chat)
    assert guide is not None and guide.guide_type == "json_schema"
    assert guide.guide is not None and orjson.loads(guide.guide) == SCHEMA
    assert guide.inputs() == {"guided_decoding_guide_type": "json_schema",
                              "guided_decoding_guide": guide.guide}
    assert Guide("json").inputs() == {"guided_decoding_guide_type": "json"}


@pytest.mark.parametrize(("response_format", "param"), [
    ("json", "response_format"),
    ({"type": "xml"}, "response_format.type"),
    ({}, "response_format.type"),
    ({"type": "json_object", "schema": {}}, "response_format.schema"),
    ({"type": "json_object", "json_schema": {"name": "a", "schema": {}}},
     "response_format.json_schema"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": SCHEMA}},
     "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "a b", "schema": SCHEMA}},
     "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "a"}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": "{}"}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": "yes"}},
     "response_format.json_schema.strict"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "x": 1}},
     "response_format.json_schema.x"),
])
def test_malformed_response_formats_are_refused_by_name(response_format: Any, param: str) -> None:
    with pytest.raises(OpenAiError) as raised:
        _guide(response_format)
    assert (raised.value.status, raised.value.param) == (400, param)


def test_backend_messages_name_response_format() -> None:
    assert openai_message("guided_decoding_guide: invalid JSON schema: x") == (
        "response_format: invalid JSON schema: x")
    assert openai_message("guided_decoding_guide_type cannot be combined with beam search") == (
        "response_format cannot be combined with beam search")
