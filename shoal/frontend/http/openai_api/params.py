"""OpenAI request bodies -> ``GenerationParams`` (what one backend request per choice needs).

Every field of the body is either understood or refused with a 400 naming it: fields this server
does not implement (``tools``, ``functions``, ``logit_bias``,
``echo``, ...) are refused unless they hold their "off" value (null, false, an empty list or
object, ``n`` / ``best_of`` 1), and unknown fields are refused too, so nothing is
silently ignored. Limits: ``n`` <= ``MAX_N``; ``stop``: a string or at most ``MAX_STOPS``
non-empty strings; ``temperature`` 0..2; ``top_p`` in (0, 1]; ``seed`` a non-negative integer.
``response_format``: see ``response_format.py``. Penalties, ``logprobs`` / ``top_logprobs`` and
``logits_processor``: see ``logprobs.py``.
``max_tokens`` (``max_completion_tokens`` for chat, which wins when both are given) must be >= 1;
its default is ``DEFAULT_MAX_TOKENS`` for completions (OpenAI's) and ``DEFAULT_CHAT_MAX_TOKENS``
for chat. The backend checks the prompt and ``max_tokens`` against the model's context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from shoal.frontend.http.openai_api.errors import invalid
from shoal.frontend.http.openai_api.logprobs import KEYS as SAMPLING_EXTRA_KEYS
from shoal.frontend.http.openai_api.logprobs import SamplingExtras, parse_extras
from shoal.frontend.http.openai_api.response_format import Guide, parse_response_format

MAX_N: Final = 8
MAX_STOPS: Final = 4
DEFAULT_MAX_TOKENS: Final = 16
DEFAULT_CHAT_MAX_TOKENS: Final = 512

_COMMON: Final = frozenset({"model", "max_tokens", "temperature", "top_p", "seed", "stop", "n",
                            "stream", "stream_options", "user", "response_format"}
                           ) | SAMPLING_EXTRA_KEYS
_COMPLETION: Final = _COMMON | {"prompt"}
_CHAT: Final = _COMMON | {"messages", "max_completion_tokens"}
# understood only in their "off" value (see the module docstring)
_OFF: Final = frozenset({"tools", "tool_choice", "functions", "function_call", "logit_bias",
                         "echo", "suffix", "best_of",
                         "parallel_tool_calls"})


@dataclass(frozen=True)
class GenerationParams:
    model: str
    chat: bool
    prompt: str  # completions: the prompt; chat: the messages as JSON text
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    n: int
    stream: bool
    include_usage: bool
    guide: Guide | None = None  # response_format's guided decoding
    # penalties, logprobs, logits_processor
    extras: SamplingExtras = field(default_factory=SamplingExtras)


def parse_params(body: bytes, *, chat: bool) -> GenerationParams:
    """Raises OpenAiError (400) naming the field at fault."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"The request body is not valid JSON: {exc}", None) from None
    if not isinstance(document, dict):
        raise invalid("The request body must be a JSON object", None)
    known = _CHAT if chat else _COMPLETION
    for key, value in document.items():
        if key in _OFF and _is_off(key, value):
            continue
        if key not in known:
            what = "supported by this server" if key in _OFF else "a known parameter"
            raise invalid(f"'{key}' is not {what}{_hint(key)}", key, "unsupported_parameter")
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required (a model name from GET /v1/models)", "model")
    stream = _bool(document, "stream")
    options = document.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise invalid("'stream_options' is only allowed when 'stream' is true",
                          "stream_options")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise invalid("'stream_options' supports only {\"include_usage\": bool}",
                          "stream_options")
        include_usage = _bool(options, "include_usage", "stream_options.include_usage")
    max_name = "max_completion_tokens" if chat and document.get(
        "max_completion_tokens") is not None else "max_tokens"
    default = DEFAULT_CHAT_MAX_TOKENS if chat else DEFAULT_MAX_TOKENS
    max_tokens = _int(document, max_name, default, low=1)
    n = _int(document, "n", 1, low=1)
    if n > MAX_N:
        raise invalid(f"'n' must be at most {MAX_N}, got {n}", "n")
    temperature = _number(document, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(document, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        raise invalid("'top_p' must be greater than 0", "top_p")
    seed = document.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)
                             or not 0 <= seed < 2**63):
        raise invalid("'seed' must be a non-negative integer below 2**63", "seed")
    user = document.get("user")
    if user is not None and not isinstance(user, str):
        raise invalid("'user' must be a string", "user")
    prompt = _messages(document) if chat else _prompt(document)
    return GenerationParams(model, chat, prompt, max_tokens, temperature, top_p, seed,
                            _stops(document), n, stream, include_usage,
                            guide=parse_response_format(document.get("response_format")),
                            extras=parse_extras(document, chat=chat))


def _hint(key: str) -> str:
    if key in ("tools", "tool_choice", "functions", "function_call", "parallel_tool_calls"):
        return " (tool / function calling is not implemented)"
    return ""


def _is_off(key: str, value: Any) -> bool:
    if key in ("n", "best_of"):
        return value is None or value == 1
    return value is None or value is False or value == [] or value == {}


def _bool(document: dict[str, Any], key: str, name: str | None = None) -> bool:
    value = document.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"'{name or key}' must be a boolean", name or key)
    return value


def _int(document: dict[str, Any], key: str, default: int, *, low: int) -> int:
    value = document.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise invalid(f"'{key}' must be an integer", key)
    if value < low:
        raise invalid(f"'{key}' must be at least {low}, got {value}", key)
    if value >= 2**31:
        raise invalid(f"'{key}' = {value} is too large", key)
    return value


def _number(document: dict[str, Any], key: str, default: float, low: float,
            high: float) -> float:
    value = document.get(key)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise invalid(f"'{key}' must be a number", key)
    if not low <= value <= high:
        raise invalid(f"'{key}' must be between {low:g} and {high:g}, got {value}", key)
    return float(value)


def _stops(document: dict[str, Any]) -> tuple[str, ...]:
    value = document.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("'stop' must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOPS:
        raise invalid(f"'stop' holds at most {MAX_STOPS} strings, got {len(stops)}", "stop")
    if any(not s for s in stops):
        raise invalid("'stop' strings must not be empty", "stop")
    return tuple(stops)


def _prompt(document: dict[str, Any]) -> str:
    prompt = document.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list):
        raise invalid("'prompt' must be one string (batched prompts and token-id prompts are "
                      "not supported; send one request per prompt)", "prompt")
    if not isinstance(prompt, str):
        raise invalid("'prompt' is required (a string)", "prompt")
    if not prompt:
        raise invalid("'prompt' must not be empty", "prompt")
    return prompt


def _messages(document: dict[str, Any]) -> str:
    """The messages, checked for shape, as JSON text for the backend (which renders them with
    the checkpoint's chat template)."""
    messages = document.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty list of messages", "messages")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise invalid(f"'{where}' must be an object", where)
        for key, value in message.items():
            if key in ("tool_calls", "function_call", "tool_call_id") and value not in (None, []):
                raise invalid(f"'{where}.{key}' is not supported (tool / function calling is "
                              f"not implemented)", f"{where}.{key}")
            if key not in ("role", "content", "name", "tool_calls", "function_call",
                           "tool_call_id"):
                raise invalid(f"'{where}.{key}' is not a known message field",
                              f"{where}.{key}")
        role = message.get("role")
        if role not in ("system", "developer", "user", "assistant"):
            raise invalid(f"'{where}.role' must be system, developer, user or assistant",
                          f"{where}.role")
        content = message.get("content")
        if not _text_content(content):
            raise invalid(f"'{where}.content' must be a string or a list of text parts "
                          f"({{\"type\": \"text\", \"text\": ...}}; images and audio are not "
                          f"supported)", f"{where}.content")
    return orjson.dumps(messages).decode()


def _text_content(content: Any) -> bool:
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text"
        and isinstance(part.get("text"), str) and set(part) <= {"type", "text"}
        for part in content)
