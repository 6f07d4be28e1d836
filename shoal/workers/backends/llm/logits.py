"""Logits post-processors and log-probabilities in the ``llm`` backend.

Model parameter ``logits_post_processors``: a python file, relative to the model's folder (it
must resolve inside it), that defines ``processor_map`` (a dict of name -> callable, TensorRT-LLM's
per-request signature ``fn(req_id, logits, ids, stream_ptr, client_id)`` changing ``logits`` in
place) and/or ``processor_batched`` (``fn(req_ids, logits_list, ids_list, stream_ptr,
client_ids)``, selected by the name ``batched``). The file is imported once, when the model
loads, in the worker process; an error there fails the load naming the parameter.

Request inputs (both forms): ``logits_post_processor_name`` BYTES [1] (TensorRT-LLM has no tensor
for it; the executor field's name), ``presence_penalty`` / ``frequency_penalty`` /
``repetition_penalty`` FP32 [1] (TensorRT-LLM backend names). Text form: ``num_top_log_probs``
INT32 [1] (0..20 alternatives per token) and the output ``token_logprobs`` BYTES [1]: when a
request names it among its outputs, each response carries a JSON array with one entry per token
of that response, in OpenAI's chat shape: ``{"token", "bytes", "logprob", "top_logprobs":
[{"token", "bytes", "logprob"}, ...]}`` (the end token that finished a sequence has none).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt
import orjson

from shoal.errors import invalid_arg
from shoal.llm import LogitsPostProcessorConfig, Request, Result
from shoal.workers.backends.base import OutputTensor

if TYPE_CHECKING:
    from tokenizers import Tokenizer

PARAMETER: Final = "logits_post_processors"
NAME_INPUT: Final = "logits_post_processor_name"
TOP_INPUT: Final = "num_top_log_probs"
PENALTY_INPUTS: Final = ("presence_penalty", "frequency_penalty", "repetition_penalty")
LOGPROBS_OUTPUT: Final = "token_logprobs"
MAX_TOP_LOG_PROBS: Final = 20
# executor field -> input name, for executor validation messages (interface.client_message)
FIELD_NAMES: Final = {"output_config.num_top_log_probs": TOP_INPUT} | {
    f"sampling_config.{name}": name for name in PENALTY_INPUTS}


def load_logits_post_processors(parameters: dict[str, str],
                                model_dir: str) -> LogitsPostProcessorConfig | None:
    """The executor's processors from the model's ``logits_post_processors`` file, or None."""
    value = parameters.get(PARAMETER, "").strip()
    if not value:
        return None
    folder = Path(model_dir).resolve()
    path = (folder / value).resolve()
    if not path.is_relative_to(folder):
        raise invalid_arg(f"llm backend: {PARAMETER} '{value}' resolves outside the model's "
                          f"folder")
    if not path.is_file():
        raise invalid_arg(f"llm backend: {PARAMETER} '{value}' is not a file in the model's "
                          f"folder")
    name = f"shoal_logits_post_processors_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise invalid_arg(f"llm backend: {PARAMETER} '{value}' is not a python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise invalid_arg(f"llm backend: {PARAMETER} '{value}' failed to import: "
                          f"{type(exc).__name__}: {exc}") from None
    processor_map = getattr(module, "processor_map", None)
    batched = getattr(module, "processor_batched", None)
    if processor_map is None and batched is None:
        raise invalid_arg(f"llm backend: {PARAMETER} '{value}' defines neither processor_map "
                          f"(a dict of name -> callable) nor processor_batched")
    if processor_map is not None and (
            not isinstance(processor_map, dict)
            or not all(isinstance(k, str) and callable(f) for k, f in processor_map.items())):
        raise invalid_arg(f"llm backend: {PARAMETER} '{value}': processor_map must be a dict "
                          f"of name -> callable")
    if batched is not None and not callable(batched):
        raise invalid_arg(f"llm backend: {PARAMETER} '{value}': processor_batched must be "
                          f"callable")
    try:
        return LogitsPostProcessorConfig(processor_map=processor_map, processor_batched=batched)
    except ValueError as exc:
        raise invalid_arg(f"llm backend: {PARAMETER} '{value}': {exc}") from None


def apply_logits_inputs(request: Request, inputs: dict[str, npt.NDArray[Any]]) -> None:
    """Set ``request``'s processor name, penalties and top log-prob count from the inputs
    (unbatched). Raises INVALID_ARG naming the input."""
    name = _one(inputs, NAME_INPUT)
    if name is not None:
        raw = name if isinstance(name, bytes) else str(name).encode()
        try:
            request.logits_post_processor_name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise invalid_arg(f"input '{NAME_INPUT}' is not valid UTF-8") from None
    config = request.sampling_config
    for penalty in PENALTY_INPUTS:
        value = _one(inputs, penalty)
        if value is not None:
            number = float(value)
            if not math.isfinite(number):
                raise invalid_arg(f"input '{penalty}' must be finite, got {number}")
            setattr(config, penalty, number)
    top = _one(inputs, TOP_INPUT)
    if top is not None:
        count = int(top)
        if not 0 <= count <= MAX_TOP_LOG_PROBS:
            raise invalid_arg(f"input '{TOP_INPUT}' must be in 0..{MAX_TOP_LOG_PROBS}, got "
                              f"{count}")
        request.output_config.num_top_log_probs = count


def want_token_logprobs(request: Request, requested_outputs: Any) -> bool:
    """True when the client asked for ``token_logprobs``; the executor then returns them."""
    if LOGPROBS_OUTPUT not in requested_outputs:
        return False
    request.output_config.return_log_probs = True
    return True


def _one(inputs: dict[str, npt.NDArray[Any]], name: str) -> Any:
    array = inputs.get(name)
    if array is None:
        return None
    if array.size != 1:
        raise invalid_arg(f"input '{name}' must hold one value, got shape {list(array.shape)}")
    return array.reshape(-1)[0].item() if array.dtype != np.object_ else array.reshape(-1)[0]


# ------------------------------------------------------------------ responses


@dataclass(frozen=True)
class _TokenText:
    text: str
    bytes: list[int]


class TokenLogprobs:
    """``token_logprobs`` entries for results of one model (token texts cached)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._byte_level = _byte_level_alphabet(tokenizer)
        self._text = lru_cache(maxsize=65536)(self._token_text)

    def _token_text(self, token: int) -> _TokenText:
        text: str = self._tokenizer.decode([token], skip_special_tokens=False)
        piece = self._tokenizer.id_to_token(token)
        if self._byte_level is not None and piece is not None and \
                all(ch in self._byte_level for ch in piece):
            return _TokenText(text, [self._byte_level[ch] for ch in piece])
        return _TokenText(text, list(text.encode("utf-8")))

    def entries(self, result: Result) -> list[dict[str, Any]]:
        """One entry per token of ``result``'s first sequence that has a log-probability."""
        log_probs = (result.log_probs or [[]])[0]
        tops = (result.top_log_probs or [[]])[0]
        tokens = result.output_token_ids[0][-len(log_probs):] if log_probs else []
        entries = []
        for index, (token, log_prob) in enumerate(zip(tokens, log_probs, strict=True)):
            chosen = self._text(token)
            alternatives = tops[index] if index < len(tops) else []
            entries.append({
                "token": chosen.text, "bytes": chosen.bytes, "logprob": _finite(log_prob),
                "top_logprobs": [{"token": (alt := self._text(t)).text, "bytes": alt.bytes,
                                  "logprob": _finite(lp)} for t, lp in alternatives]})
        return entries

    def output(self, result: Result, *, batching: bool) -> OutputTensor:
        array = np.array([orjson.dumps(self.entries(result))], dtype=np.object_)
        return OutputTensor(LOGPROBS_OUTPUT, "BYTES", array[np.newaxis] if batching else array)


def _finite(value: float) -> float:
    """OpenAI clients expect numbers: -inf (a banned token) becomes -9999.0, as OpenAI does."""
    return value if math.isfinite(value) else -9999.0


def _byte_level_alphabet(tokenizer: Tokenizer) -> dict[str, int] | None:
    """GPT-2's byte -> printable character map inverted, when the tokenizer is byte-level."""
    decoder = getattr(tokenizer, "decoder", None)
    if decoder is None or type(decoder).__name__ != "ByteLevel":
        return None
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    characters = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, characters, strict=True)}
