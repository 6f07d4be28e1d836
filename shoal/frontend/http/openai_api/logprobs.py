"""The OpenAI sampling fields served through the ``llm`` backend's logits inputs:
``presence_penalty`` / ``frequency_penalty`` (-2..2), ``logprobs`` (chat: a boolean; completions:
an integer 0..``MAX_TOP_LOGPROBS``, the number of alternatives), chat's ``top_logprobs``
(0..``MAX_TOP_LOGPROBS``, needs ``logprobs`` true) and the shoal extension ``logits_processor``
(the name of a logits post-processor shipped in the model's folder; vLLM-style extra body).

``SamplingExtras.backend_inputs`` gives the text-form inputs they become; ``token_logprobs``
entries (the backend's JSON, OpenAI's chat shape) become the response's ``logprobs`` here: chat
``{"content": [entries]}``, completions ``{"tokens", "token_logprobs", "top_logprobs" (a dict
token text -> log-prob per token, the chosen token included), "text_offset"}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson

from shoal.frontend.http.openai_api.errors import invalid

if TYPE_CHECKING:
    from shoal.messages import ModelVersionInfo

MAX_TOP_LOGPROBS: Final = 20
MAX_PENALTY: Final = 2.0
KEYS: Final = frozenset({"presence_penalty", "frequency_penalty", "logprobs", "top_logprobs",
                         "logits_processor"})
LOGPROBS_OUTPUT: Final = "token_logprobs"
# backend input names -> the OpenAI parameter an error about them concerns
PARAM_OF_INPUT: Final = {"logits_post_processor_name": "logits_processor",
                         "num_top_log_probs": "top_logprobs",
                         "presence_penalty": "presence_penalty",
                         "frequency_penalty": "frequency_penalty"}

Entry = dict[str, Any]  # one token: {"token", "bytes", "logprob", "top_logprobs": [...]}


@dataclass(frozen=True)
class SamplingExtras:
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: bool = False  # return the chosen tokens' log-probabilities
    top_logprobs: int = 0  # alternatives per token
    logits_processor: str | None = None

    def backend_inputs(self) -> dict[str, Any]:
        """Text-form inputs for one backend request (only those that are set)."""
        inputs: dict[str, Any] = {}
        if self.presence_penalty:
            inputs["presence_penalty"] = self.presence_penalty
        if self.frequency_penalty:
            inputs["frequency_penalty"] = self.frequency_penalty
        if self.top_logprobs:
            inputs["num_top_log_probs"] = self.top_logprobs
        if self.logits_processor is not None:
            inputs["logits_post_processor_name"] = self.logits_processor
        return inputs

    def needed(self) -> tuple[list[str], list[str]]:
        """(inputs, outputs) the model's config must declare for this request."""
        outputs = [LOGPROBS_OUTPUT] if self.logprobs else []
        return list(self.backend_inputs()), outputs


def parse_extras(document: dict[str, Any], *, chat: bool) -> SamplingExtras:
    """Raises OpenAiError (400) naming the field at fault."""
    presence = _penalty(document, "presence_penalty")
    frequency = _penalty(document, "frequency_penalty")
    processor = document.get("logits_processor")
    if processor is not None and (not isinstance(processor, str) or not processor):
        raise invalid("'logits_processor' must be a non-empty string (the name of a logits "
                      "post-processor of the model)", "logits_processor")
    raw = document.get("logprobs")
    top = document.get("top_logprobs")
    if chat:
        if raw is not None and not isinstance(raw, bool):
            raise invalid("'logprobs' must be a boolean", "logprobs")
        logprobs = bool(raw)
        count = _count(top, "top_logprobs")
        if top is not None and not logprobs:
            raise invalid("'top_logprobs' needs 'logprobs' set to true", "top_logprobs")
    else:
        if top is not None:
            raise invalid("'top_logprobs' is a chat parameter; completions take the number "
                          "of alternatives in 'logprobs'", "top_logprobs")
        logprobs = raw is not None and raw is not False
        count = _count(raw, "logprobs") if logprobs else 0
    return SamplingExtras(presence, frequency, logprobs, count, processor)


def _penalty(document: dict[str, Any], key: str) -> float:
    value = document.get(key)
    if value is None:
        return 0.0
    if not isinstance(value, int | float) or isinstance(value, bool) or \
            not -MAX_PENALTY <= value <= MAX_PENALTY:
        raise invalid(f"'{key}' must be a number between -2 and 2, got {value!r}", key)
    return float(value)


def _count(value: Any, key: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or \
            not 0 <= value <= MAX_TOP_LOGPROBS:
        raise invalid(f"'{key}' must be an integer between 0 and {MAX_TOP_LOGPROBS}, got "
                      f"{value!r}", key)
    return value


def chat_logprobs(entries: list[Entry]) -> dict[str, Any]:
    return {"content": entries, "refusal": None}


class CompletionLogprobs:
    """Completions' ``logprobs`` for one choice; keeps the text offset across chunks."""

    def __init__(self) -> None:
        self._offset = 0

    def document(self, entries: list[Entry]) -> dict[str, Any]:
        tokens, offsets, tops = [], [], []
        for entry in entries:
            tokens.append(entry["token"])
            offsets.append(self._offset)
            self._offset += len(entry["token"])
            # keyed by text, so tokens that decode alike (partial characters) share a key: the
            # chosen token's own log-prob wins, then the likelier alternative
            top = {entry["token"]: entry["logprob"]}
            for alt in entry["top_logprobs"]:
                top.setdefault(alt["token"], alt["logprob"])
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": tops, "text_offset": offsets}


def require_extras_interface(model: ModelVersionInfo, extras: SamplingExtras) -> None:
    """400 naming the field when the model's config lacks an input / output it needs."""
    declared_inputs = {spec.name for spec in model.inputs}
    declared_outputs = {spec.name for spec in model.outputs}
    inputs, outputs = extras.needed()
    for name in inputs:
        if name not in declared_inputs:
            param = PARAM_OF_INPUT.get(name, name)
            raise invalid(f"model '{model.name}' cannot serve '{param}': its config lacks "
                          f"input '{name}' (see examples/llm_repository/llm/config.pbtxt)",
                          param)
    for name in outputs:
        if name not in declared_outputs:
            raise invalid(f"model '{model.name}' cannot serve 'logprobs': its config lacks "
                          f"output '{name}' (see examples/llm_repository/llm/config.pbtxt)",
                          "logprobs")


def entries_of(values: dict[str, Any]) -> list[Entry] | None:
    """The ``token_logprobs`` entries of one backend response, if it has them."""
    raw = values.get(LOGPROBS_OUTPUT)
    if raw is None:
        return None
    entries: list[Entry] = orjson.loads(raw)
    return entries


class LogprobsShaper:
    """The ``logprobs`` value of each choice of one request (None when not asked for)."""

    def __init__(self, extras: SamplingExtras, *, chat: bool, n: int) -> None:
        self._wanted = extras.logprobs
        self._chat = chat
        self._completions = [CompletionLogprobs() for _ in range(n)]

    def document(self, index: int, entries: list[Entry] | None) -> dict[str, Any] | None:
        """For a whole choice pass every entry (maybe none); for a stream chunk, the chunk's
        (a chunk without tokens gets None, as OpenAI sends)."""
        if not self._wanted or entries is None:
            return None
        return chat_logprobs(entries) if self._chat else \
            self._completions[index].document(entries)
