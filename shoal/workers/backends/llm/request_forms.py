"""One batch item's inputs -> an executor ``Request``, in either form of an ``llm`` model's
request (docs/architecture.md §7, the llm backend; the forms and their inputs: ``interface.py``).

- ``tensor_request``: the tensor form (``input_ids``, ``request_output_len``, ...; no end id
  unless the request gives one).
- ``text_request``: the text form (``text_input`` or ``messages`` through the chat template,
  tokenized with the checkpoint's tokenizer; ``max_tokens`` defaults to
  ``TEXT_DEFAULT_MAX_TOKENS``, the end id to the checkpoint's ``eos_token_id``).

Both read the guided-decoding (``guided.py``) and logits (``logits.py``) inputs too, and
return a ``ParsedRequest``: the request and, for error messages, the client's name of each
executor field. A bad input raises INVALID_ARG naming it. Both check the prompt's size against
the model's ``PromptBounds`` first (``prompt_bounds.py``): bytes before any text is decoded or
tokenized, ``input_ids`` before its ids are read; text is tokenized with the GIL released.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy.typing as npt

from shoal.errors import invalid_arg
from shoal.llm import OutputConfig, Request, SamplingConfig
from shoal.workers.backends.llm.guided import FIELD_NAMES as GUIDED_FIELD_NAMES
from shoal.workers.backends.llm.guided import guided_params
from shoal.workers.backends.llm.logits import FIELD_NAMES as LOGITS_FIELD_NAMES
from shoal.workers.backends.llm.logits import apply_logits_inputs
from shoal.workers.backends.llm.prompt_bounds import PromptBounds, element_size, encode

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from shoal.workers.backends.llm.chat_template import ChatTemplate

TEXT_DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class ParsedRequest:
    request: Request
    text_form: bool
    # executor field name -> the name the client used, for error messages
    field_names: dict[str, str]


def _scalar(inputs: dict[str, npt.NDArray[Any]], name: str) -> Any:
    array = inputs.get(name)
    if array is None:
        return None
    if array.size != 1:
        raise invalid_arg(f"input '{name}' must hold one value, got shape {list(array.shape)}")
    return array.reshape(-1)[0].item()


def _int(inputs: dict[str, npt.NDArray[Any]], name: str) -> int | None:
    value = _scalar(inputs, name)
    return None if value is None else int(value)


def _float(inputs: dict[str, npt.NDArray[Any]], name: str) -> float | None:
    value = _scalar(inputs, name)
    if value is None:
        return None
    number = float(value)
    if not math.isfinite(number):
        raise invalid_arg(f"input '{name}' must be finite, got {number}")
    return number


def _end_id(inputs: dict[str, npt.NDArray[Any]], default: int | None) -> int | None:
    """``end_id``: absent -> ``default``; -1 -> none (the sequence runs to its length)."""
    value = _int(inputs, "end_id")
    if value is None:
        return default
    return None if value == -1 else value


def _seed(inputs: dict[str, npt.NDArray[Any]]) -> int | None:
    """``random_seed``, else ``seed`` (the name of TensorRT-LLM's stock config)."""
    seed = _int(inputs, "random_seed")
    return _int(inputs, "seed") if seed is None else seed


def _seed_name(inputs: dict[str, npt.NDArray[Any]]) -> str:
    """The input ``_seed`` read, for the executor's messages about it."""
    return "seed" if "seed" in inputs and "random_seed" not in inputs else "random_seed"


def _top_k(value: int | None, name: str) -> int | None:
    if value is not None and value < 0:
        raise invalid_arg(f"input '{name}' must be >= 0, got {value}")
    return value


def tensor_request(inputs: dict[str, npt.NDArray[Any]], exclude_input: bool,
                   bounds: PromptBounds) -> ParsedRequest:
    """The tensor form (TensorRT-LLM's names) of one batch item's inputs."""
    bounds.check_tokens("input_ids", int(inputs["input_ids"].size))
    ids = [int(t) for t in inputs["input_ids"].reshape(-1)]
    length = _int(inputs, "input_lengths")
    if length is not None:
        if not 0 <= length <= len(ids):
            raise invalid_arg(f"input 'input_lengths' = {length} is outside 0..{len(ids)} "
                              f"(the length of input_ids)")
        ids = ids[:length]
    max_tokens = _int(inputs, "request_output_len")
    if max_tokens is None:
        raise invalid_arg("the request needs input 'request_output_len'")
    request = Request(
        ids, max_tokens,
        streaming=bool(_scalar(inputs, "streaming") or False),
        sampling_config=SamplingConfig(
            _int(inputs, "beam_width") or 1,
            temperature=_float(inputs, "temperature"),
            top_k=_top_k(_int(inputs, "runtime_top_k"), "runtime_top_k"),
            top_p=_float(inputs, "runtime_top_p"), seed=_seed(inputs)),
        output_config=OutputConfig(
            return_log_probs=bool(_scalar(inputs, "return_log_probs") or False),
            exclude_input_from_output=exclude_input),
        end_id=_end_id(inputs, None), pad_id=_int(inputs, "pad_id"),
        stop_words=_word_list(inputs, "stop_words_list"),
        bad_words=_word_list(inputs, "bad_words_list"),
        guided_decoding_params=guided_params(inputs))
    apply_logits_inputs(request, inputs)
    names = {"input_token_ids": "input_ids", "input length": "input_ids length",
             "max_tokens": "request_output_len",
             "stop_words": "stop_words_list", "bad_words": "bad_words_list",
             "sampling_config.top_k": "runtime_top_k", "sampling_config.top_p": "runtime_top_p",
             "sampling_config.seed": _seed_name(inputs)} | GUIDED_FIELD_NAMES | LOGITS_FIELD_NAMES
    return ParsedRequest(request, False, names)


def _word_list(inputs: dict[str, npt.NDArray[Any]], name: str) -> list[list[int]] | None:
    array = inputs.get(name)
    if array is None:
        return None
    if array.ndim != 2 or array.shape[0] != 2:
        raise invalid_arg(f"input '{name}' must have shape [2, N] (token ids, then word end "
                          f"offsets padded with -1), got {list(array.shape)}")
    ids = [int(t) for t in array[0]]
    words: list[list[int]] = []
    start = 0
    for end in (int(o) for o in array[1]):
        if end < 0:
            break
        if not start < end <= len(ids):
            raise invalid_arg(f"input '{name}': word end offset {end} is not after {start} "
                              f"and within the {len(ids)} token ids")
        words.append(ids[start:end])
        start = end
    return words or None


def _one_text(inputs: dict[str, npt.NDArray[Any]], name: str, bounds: PromptBounds) -> str:
    for item in inputs[name].reshape(-1):  # before anything is decoded
        bounds.check_bytes(f"input '{name}'", element_size(item))
    texts = _text(inputs[name], name)
    if len(texts) != 1:
        raise invalid_arg(f"input '{name}' must hold one string, got {len(texts)}")
    if not texts[0]:
        raise invalid_arg(f"input '{name}' must not be empty")
    return texts[0]


def _prompt_ids(inputs: dict[str, npt.NDArray[Any]], tokenizer: Tokenizer,
                chat_template: ChatTemplate | None, bounds: PromptBounds) -> list[int]:
    """The prompt's token ids: ``text_input`` encoded as is, or ``messages`` through the chat
    template (encoded without added special tokens, as ``apply_chat_template`` does)."""
    if "messages" not in inputs:
        return encode(tokenizer, _one_text(inputs, "text_input", bounds))
    if "text_input" in inputs:
        raise invalid_arg("send either input 'text_input' or 'messages', not both")
    from shoal.workers.backends.llm.chat_template import parse_messages

    messages = parse_messages(_one_text(inputs, "messages", bounds))
    if chat_template is None:
        raise invalid_arg("input 'messages' needs a chat template, and this model's checkpoint "
                          "has none (tokenizer_config.json 'chat_template' or "
                          "chat_template.jinja); send text_input")
    rendered = chat_template.render(messages)
    bounds.check_bytes("input 'messages' (rendered with the chat template)",
                       len(rendered.encode()))
    return encode(tokenizer, rendered, add_special_tokens=False)


def text_request(inputs: dict[str, npt.NDArray[Any]], tokenizer: Tokenizer,
                 eos_token_id: int | None, exclude_input: bool,
                 chat_template: ChatTemplate | None, bounds: PromptBounds) -> ParsedRequest:
    """The text form (``text_input`` or ``messages``) of one batch item's inputs."""
    ids = _prompt_ids(inputs, tokenizer, chat_template, bounds)
    max_tokens = _int(inputs, "max_tokens")
    request = Request(
        ids, TEXT_DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        streaming=bool(_scalar(inputs, "stream") or False),
        sampling_config=SamplingConfig(
            _int(inputs, "beam_width") or 1,
            temperature=_float(inputs, "temperature"),
            top_k=_top_k(_int(inputs, "top_k"), "top_k"),
            top_p=_float(inputs, "top_p"), seed=_seed(inputs)),
        output_config=OutputConfig(exclude_input_from_output=exclude_input),
        end_id=_end_id(inputs, eos_token_id), pad_id=_int(inputs, "pad_id"),
        stop_words=_text_words(inputs, "stop_words", tokenizer, bounds),
        bad_words=_text_words(inputs, "bad_words", tokenizer, bounds),
        guided_decoding_params=guided_params(inputs))
    apply_logits_inputs(request, inputs)
    prompt_name = "messages" if "messages" in inputs else "text_input"
    names = {"input_token_ids": prompt_name, "input length": f"{prompt_name} length (tokens)",
             "sampling_config.top_k": "top_k",
             "sampling_config.top_p": "top_p", "sampling_config.seed": _seed_name(inputs),
             } | GUIDED_FIELD_NAMES | LOGITS_FIELD_NAMES
    return ParsedRequest(request, True, names)


def _text(array: npt.NDArray[Any], name: str) -> list[str]:
    texts: list[str] = []
    for item in array.reshape(-1):
        raw = item if isinstance(item, bytes) else str(item).encode()
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise invalid_arg(f"input '{name}' is not valid UTF-8") from None
    return texts


def _text_words(inputs: dict[str, npt.NDArray[Any]], name: str, tokenizer: Tokenizer,
                bounds: PromptBounds) -> list[list[int]] | None:
    array = inputs.get(name)
    if array is None:
        return None
    bounds.check_bytes(f"input '{name}' (all words)",
                       sum(element_size(item) for item in array.reshape(-1)))
    words: list[list[int]] = []
    for index, text in enumerate(_text(array, name)):
        ids = encode(tokenizer, text, add_special_tokens=False)
        if not ids:
            raise invalid_arg(f"input '{name}'[{index}] must not be empty")
        words.append(ids)
    return words or None
