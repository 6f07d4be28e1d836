"""OpenAI's ``response_format`` -> the ``llm`` backend's guided decoding inputs.

- ``{"type": "text"}`` (or null): free text.
- ``{"type": "json_object"}``: any JSON value (guide type ``json``: the output parses as JSON).
- ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "description": ...,
  "strict": ...}}``: JSON valid under ``schema`` (guide type ``json_schema``). ``name`` is
  required (OpenAI's rule: 1-64 of ``a-zA-Z0-9_-``); the schema is always enforced, ``strict``
  or not. The backend compiles the schema: one that does not compile is a 400 naming
  ``response_format``.

The output can still be cut short by ``max_tokens`` (``finish_reason`` ``length``): then it is a
prefix of a valid output, not valid itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson

from shoal.frontend.http.openai_api.errors import invalid

if TYPE_CHECKING:
    from shoal.messages import ModelVersionInfo

PARAM: Final = "response_format"
TYPE_INPUT: Final = "guided_decoding_guide_type"
GUIDE_INPUT: Final = "guided_decoding_guide"
_NAME: Final = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_SCHEMA_KEYS: Final = frozenset({"name", "description", "schema", "strict"})


@dataclass(frozen=True)
class Guide:
    """Values of the backend's ``guided_decoding_guide_type`` / ``guided_decoding_guide``."""

    guide_type: str
    guide: str | None = None

    def inputs(self) -> dict[str, str]:
        """The text-form document fields that carry this guide."""
        fields = {TYPE_INPUT: self.guide_type}
        if self.guide is not None:
            fields[GUIDE_INPUT] = self.guide
        return fields


def parse_response_format(value: Any) -> Guide | None:
    """The guide ``response_format`` asks for (None: free text). Raises OpenAiError (400)
    naming the field at fault."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid(f"'{PARAM}' must be an object such as {{\"type\": \"json_object\"}}", PARAM)
    kind = value.get("type")
    extra = sorted(set(value) - {"type", "json_schema"})
    if extra:
        raise invalid(f"'{PARAM}.{extra[0]}' is not a known field", f"{PARAM}.{extra[0]}")
    if kind in ("text", "json_object"):
        if "json_schema" in value:
            raise invalid(f"'{PARAM}.json_schema' is only allowed with type json_schema",
                          f"{PARAM}.json_schema")
        return None if kind == "text" else Guide("json")
    if kind == "json_schema":
        return Guide("json_schema", _schema_text(value.get("json_schema")))
    raise invalid(f"'{PARAM}.type' must be text, json_object or json_schema", f"{PARAM}.type")


def _schema_text(spec: Any) -> str:
    where = f"{PARAM}.json_schema"
    if not isinstance(spec, dict):
        raise invalid(f"'{where}' is required with type json_schema: {{\"name\": ..., "
                      f"\"schema\": {{...}}}}", where)
    extra = sorted(set(spec) - _SCHEMA_KEYS)
    if extra:
        raise invalid(f"'{where}.{extra[0]}' is not a known field", f"{where}.{extra[0]}")
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise invalid(f"'{where}.name' must be 1 to 64 letters, digits, '_' or '-'",
                      f"{where}.name")
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid(f"'{where}.description' must be a string", f"{where}.description")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid(f"'{where}.strict' must be a boolean", f"{where}.strict")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        raise invalid(f"'{where}.schema' must be a JSON schema object", f"{where}.schema")
    return orjson.dumps(schema).decode()


def require_guide_inputs(model: ModelVersionInfo, guide: Guide | None) -> None:
    """400 when ``response_format`` asks for a guide and the model's config lacks the inputs
    that carry it."""
    if guide is None:
        return
    inputs = {spec.name for spec in model.inputs}
    missing = [name for name in (TYPE_INPUT, GUIDE_INPUT) if name not in inputs]
    if missing:
        raise invalid(f"model '{model.name}' cannot serve '{PARAM}': its config lacks input(s) "
                      f"{', '.join(missing)} (see examples/llm_repository/llm/config.pbtxt)",
                      PARAM)


def openai_message(message: str) -> str:
    """A backend message about the guide inputs, in the client's terms."""
    return message.replace(f"input '{GUIDE_INPUT}'", f"'{PARAM}'").replace(
        f"{GUIDE_INPUT}:", f"{PARAM}:").replace(TYPE_INPUT, PARAM)
