"""The frontend's prompt-size check for ``llm``-backend models (``config/prompt_limits.py``):
a decoded generate / OpenAI request whose ``text_input`` or ``messages`` element, or whose
``stop_words`` / ``bad_words`` together, exceed the model's byte limit is refused with
INVALID_ARG naming the limit before it leaves the frontend. Other models are not checked.
The worker checks again (infer and gRPC requests reach it without this check).
"""

from __future__ import annotations

import functools
from typing import Final

import orjson

from shoal.config import prompt_limits
from shoal.errors import invalid_arg
from shoal.frontend.core.decoded import DecodedInput, DecodedRequest
from shoal.messages import ModelVersionInfo

_LLM_BACKEND: Final = "llm"
_PROMPTS: Final = ("text_input", "messages")  # each element is one prompt
_WORDS: Final = ("stop_words", "bad_words")  # all elements together


@functools.lru_cache(maxsize=128)
def _limit_of(config_json: bytes) -> int | None:
    """The byte limit of the model with this config (Triton's JSON form), None when it is not
    an llm-backend model. Cached: a snapshot's config bytes are the same object per request."""
    try:
        config = orjson.loads(config_json)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(config, dict) or config.get("backend") != _LLM_BACKEND:
        return None
    raw = config.get("parameters")
    parameters: dict[str, str] = {}
    if isinstance(raw, dict):
        for key, value in raw.items():
            if isinstance(value, dict) and isinstance(value.get("string_value"), str):
                parameters[str(key)] = value["string_value"]
    return prompt_limits.frontend_byte_limit(parameters)


def element_sizes(tensor: DecodedInput) -> list[int]:
    """The byte length of each element of a BYTES tensor (4-byte little-endian length, then
    the bytes, Triton's layout); stops at the end of the data."""
    data, sizes, offset = tensor.data, [], 0
    for _ in range(tensor.element_count):
        if offset + 4 > len(data):
            break
        size = int.from_bytes(data[offset:offset + 4], "little")
        sizes.append(size)
        offset += 4 + size
    return sizes


def check_prompt_size(request: DecodedRequest, model: ModelVersionInfo) -> None:
    """Raises INVALID_ARG (``prompt_limits.over_limit_message``) for an over-limit prompt."""
    limit = _limit_of(model.config_json)
    if limit is None:
        return
    for tensor in request.inputs:
        if tensor.datatype != "BYTES" or tensor.shm is not None:
            continue
        sizes = element_sizes(tensor)
        if tensor.name in _PROMPTS:
            size = max(sizes, default=0)
        elif tensor.name in _WORDS:
            size = sum(sizes)
        else:
            continue
        if size > limit:
            raise invalid_arg(prompt_limits.over_limit_message(f"input '{tensor.name}'", size,
                                                               limit))
