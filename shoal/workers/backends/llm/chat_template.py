"""A checkpoint's chat template, rendered as Hugging Face's ``apply_chat_template`` renders it.

The template comes from the checkpoint directory: ``chat_template.jinja`` if present, else
``tokenizer_config.json``'s ``chat_template`` (a string, or a list of ``{"name", "template"}``
of which the one named ``default`` is used). It is compiled once, in jinja2's
``ImmutableSandboxedEnvironment`` with ``trim_blocks`` / ``lstrip_blocks``, the ``loopcontrols``
extension, a ``tojson`` filter that keeps non-ASCII text, and the globals ``raise_exception``
and ``strftime_now`` (Hugging Face's environment, less its ``{% generation %}`` tag, which only
serves training masks). Each render gets ``messages``, ``add_generation_prompt=True``,
``tools=None``, ``documents=None`` and the special tokens of ``tokenizer_config.json``
(``bos_token``, ``eos_token``, ``unk_token``, ``pad_token``; strings or ``{"content"}`` objects).

Messages are checked before rendering: a JSON array of objects, each with a string ``role`` and
a ``content`` that is a string or a list of ``{"type": "text", "text"}`` parts (joined, as
OpenAI's servers accept them). Problems raise INVALID_ARG naming the input.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from shoal.errors import invalid_arg

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        import jinja2.ext
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
                   separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                              separators=separators, sort_keys=sort_keys)

        def strftime_now(format: str) -> str:
            return datetime.now().strftime(format)

        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        environment.filters["tojson"] = tojson
        environment.globals["raise_exception"] = raise_exception
        environment.globals["strftime_now"] = strftime_now
        try:
            self._template = environment.from_string(source)
        except TemplateError as exc:
            raise invalid_arg(f"llm backend: the checkpoint's chat template does not compile: "
                              f"{exc}") from None
        self._special_tokens = special_tokens

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The prompt for ``messages`` (checked with ``parse_messages``), ending with the
        assistant's generation prompt. A template error (``raise_exception`` included) raises
        INVALID_ARG: the template refused these messages."""
        from jinja2.exceptions import TemplateError

        try:
            text: str = self._template.render(
                messages=messages, add_generation_prompt=True, tools=None, documents=None,
                **self._special_tokens)
        except TemplateError as exc:
            raise invalid_arg(f"input 'messages': the chat template refused them: {exc}") from None
        return text


def load_chat_template(checkpoint_dir: str | Path) -> ChatTemplate | None:
    """The checkpoint's chat template, or None when it has none. Raises INVALID_ARG for an
    unreadable ``tokenizer_config.json`` or a template that does not compile."""
    directory = Path(checkpoint_dir)
    config = _tokenizer_config(directory / CONFIG_FILE)
    template_file = directory / TEMPLATE_FILE
    source: Any = (template_file.read_text(encoding="utf-8") if template_file.is_file()
                   else config.get("chat_template"))
    if isinstance(source, list):  # named templates
        named = {item.get("name"): item.get("template") for item in source
                 if isinstance(item, dict)}
        source = named.get("default")
    if source is None:
        return None
    if not isinstance(source, str):
        raise invalid_arg(f"llm backend: {CONFIG_FILE}: 'chat_template' must be a string")
    special: dict[str, str] = {}
    for name in _SPECIAL_TOKENS:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            special[name] = value
    return ChatTemplate(source, special)


def _tokenizer_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise invalid_arg(f"llm backend: {CONFIG_FILE} cannot be read: {exc}") from None
    if not isinstance(document, dict):
        raise invalid_arg(f"llm backend: {CONFIG_FILE} must hold a JSON object")
    return document


def parse_messages(text: str) -> list[dict[str, Any]]:
    """The ``messages`` input (JSON text) -> the list the template renders; content parts of
    type ``text`` are joined into one string."""
    try:
        messages = json.loads(text)
    except json.JSONDecodeError as exc:
        raise invalid_arg(f"input 'messages' is not JSON: {exc}") from None
    if not isinstance(messages, list) or not messages:
        raise invalid_arg("input 'messages' must be a non-empty JSON array of messages")
    checked: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid_arg(f"input 'messages'[{index}] must be an object")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise invalid_arg(f"input 'messages'[{index}].role must be a non-empty string")
        checked.append({**message, "content": _content(message.get("content"), index)})
    return checked


def _content(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise invalid_arg(f"input 'messages'[{index}].content: only text parts "
                                  f"({{\"type\": \"text\", \"text\": ...}}) are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise invalid_arg(f"input 'messages'[{index}].content must be a string or a list of "
                      f"text parts")
