"""The request / response tensors of an ``llm`` model -> executor ``Request`` and back.

Two forms on the same model (the first input present decides):

- **tensors** (TensorRT-LLM backend names): ``input_ids`` INT32 [-1] (required),
  ``request_output_len`` INT32 [1] (required), optional ``input_lengths``, ``end_id``,
  ``pad_id``, ``beam_width``, ``temperature``, ``runtime_top_k``, ``runtime_top_p``,
  ``random_seed`` (UINT64; or ``seed``), ``stop_words_list`` / ``bad_words_list`` (INT32
  [2, -1]: token ids, then the end offset of each word, padded with -1), ``streaming``,
  ``return_log_probs`` (BOOL)
  -> ``output_ids`` [beams, len], ``sequence_length`` [beams], ``cum_log_probs`` [beams],
  ``output_log_probs`` [beams, len] (zeros unless ``return_log_probs``). The end id defaults to
  none (TRT-LLM's preprocessing model supplies it); ``end_id`` -1 means none in both forms.
- **text** (Triton ``generate`` users): ``text_input`` BYTES [1] (required), ``max_tokens``
  (default 16), ``stop_words`` / ``bad_words`` (BYTES [-1]), ``temperature``, ``top_k``,
  ``top_p``, ``random_seed``, ``beam_width``, ``end_id``, ``stream`` -> ``text_output`` BYTES
  [1]. Text is tokenized with the checkpoint's ``tokenizer.json``; the end id defaults to the
  checkpoint's ``eos_token_id``. Instead of ``text_input`` a request may send ``messages``
  BYTES [1]: a JSON array of chat messages, rendered with the checkpoint's chat template
  (``chat_template.py``) and tokenized without added special tokens (the template places them),
  as Hugging Face's ``apply_chat_template(..., add_generation_prompt=True)`` does.
  Three more outputs come only when the request names them among its requested outputs (the
  OpenAI-compatible frontend does; ``generate`` answers stay ``text_output`` alone):
  ``prompt_tokens`` INT32 [1] (the prompt's token count), ``completion_tokens`` INT32 [1]
  (tokens generated so far, counting the end id that finished the sequence) and
  ``finish_reason`` BYTES [1] (``""`` until the last response, then ``stop`` for the end id or a
  stop word, ``length``, or ``cancelled`` / ``timed_out``).
- **both forms**: ``guided_decoding_guide_type`` / ``guided_decoding_guide`` (BYTES [1],
  TensorRT-LLM's names) hold the output to a JSON schema, regex, ... (``guided.py``).
- **both forms**: ``logits_post_processor_name`` (BYTES [1]) picks a logits post-processor of
  the model, ``presence_penalty`` / ``frequency_penalty`` / ``repetition_penalty`` (FP32 [1]);
  text form: ``num_top_log_probs`` and the ``token_logprobs`` output (``logits.py``).

**Batches** (TensorRT-LLM's ``tensorrt_llm`` model): when the model batches (``max_batch_size``
> 0) every tensor carries a leading batch dimension N (1 <= N <= ``max_batch_size``), the same
for every input (Triton's rule; no broadcast from 1). ``split_batch`` cuts the request into N
items, one executor ``Request`` each: item i takes row i of every input (``input_ids`` row i cut
to ``input_lengths`` [i], which is required when N > 1, as in TensorRT-LLM, since the rows are
padded to the longest; ``text_input`` [N, 1] gives N prompts). Every item must agree on
``streaming`` / ``stream``. A problem in item i raises INVALID_ARG prefixed ``batch item i:``
and nothing runs. Responses (see ``backend.py``): streaming, each response holds one item's
outputs with a batch dimension of 1 plus ``batch_index`` INT32 [1, 1] (which item); the final
flag comes only once every item has finished. Non-streaming: one response holding every item,
``stack_items``: ``output_ids`` [N, beams, max len] padded with each item's pad id (its
``pad_id``, else its end id), ``sequence_length`` [N, beams] (0 for a beam an item lacks),
``text_output`` [N, 1] ..., and ``batch_index`` [N, 1] = 0..N-1. ``batch_index`` is sent when
the request names it among its outputs, or when it names none, N > 1 and the model declares it
(TensorRT-LLM sends it for N > 1 only). A batch of one answers as before. Problems raise
INVALID_ARG naming the input.

Here: the batch split, which form a request takes, the executor's messages in the client's
names, and the response tensors; each form's inputs are read in ``request_forms.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shoal.errors import ShoalError, invalid_arg
from shoal.llm import FinishReason, Result
from shoal.workers.backends.base import BackendRequest, OutputTensor
from shoal.workers.backends.llm.prompt_bounds import UNBOUNDED, PromptBounds
from shoal.workers.backends.llm.request_forms import ParsedRequest, tensor_request, text_request

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from shoal.workers.backends.llm.chat_template import ChatTemplate

TEXT_INPUTS = ("text_input", "messages", "max_tokens", "stop_words", "bad_words", "top_k",
               "top_p", "stream")
TENSOR_INPUTS = ("input_ids", "input_lengths", "request_output_len", "runtime_top_k",
                 "runtime_top_p", "stop_words_list", "bad_words_list", "streaming",
                 "return_log_probs")
PROMPT_INPUTS = ("input_ids", "text_input", "messages")  # the first present sets the batch size
BATCH_INDEX = "batch_index"


def parse_requests(backend_request: BackendRequest, *, batching: bool,
                   tokenizer: Tokenizer | None, eos_token_id: int | None,
                   exclude_input: bool, chat_template: ChatTemplate | None = None,
                   max_batch_size: int = 0, bounds: PromptBounds = UNBOUNDED
                   ) -> list[ParsedRequest]:
    """One ``ParsedRequest`` per batch item, in batch order (one when the model does not
    batch). ``max_batch_size`` 0: no limit checked here. ``bounds``: each item's prompt size
    limits, checked before it is tokenized (``prompt_bounds.py``)."""
    items = split_batch(backend_request.inputs, batching, max_batch_size)
    parsed: list[ParsedRequest] = []
    for index, inputs in enumerate(items):
        try:
            parsed.append(_parse_item(inputs, tokenizer, eos_token_id, exclude_input,
                                      chat_template, bounds))
        except ShoalError as exc:
            if len(items) == 1:
                raise
            raise ShoalError(exc.code, f"batch item {index}: {exc.message}") from None
    if len({item.request.streaming for item in parsed}) > 1:
        name = "stream" if parsed[0].text_form else "streaming"
        raise invalid_arg(f"input '{name}' must be the same for every batch item")
    return parsed


def parse_request(backend_request: BackendRequest, *, batching: bool,
                  tokenizer: Tokenizer | None, eos_token_id: int | None,
                  exclude_input: bool, chat_template: ChatTemplate | None = None
                  ) -> ParsedRequest:
    """A request of one sequence (``parse_requests`` with a limit of 1)."""
    return parse_requests(backend_request, batching=batching, tokenizer=tokenizer,
                          eos_token_id=eos_token_id, exclude_input=exclude_input,
                          chat_template=chat_template, max_batch_size=1)[0]


def _parse_item(inputs: dict[str, npt.NDArray[Any]], tokenizer: Tokenizer | None,
                eos_token_id: int | None, exclude_input: bool,
                chat_template: ChatTemplate | None, bounds: PromptBounds) -> ParsedRequest:
    if "text_input" in inputs or "messages" in inputs:
        stray = sorted(set(inputs) & set(TENSOR_INPUTS))
        if stray:
            raise invalid_arg(f"input(s) {', '.join(stray)} belong to the token form; a "
                              f"text_input request uses max_tokens, stop_words, top_k, ...")
        if tokenizer is None:
            raise invalid_arg("text_input needs the checkpoint's tokenizer.json, which this "
                              "model's checkpoint lacks; send input_ids")
        return text_request(inputs, tokenizer, eos_token_id, exclude_input, chat_template,
                            bounds)
    if "input_ids" not in inputs:
        raise invalid_arg("the request needs input 'input_ids' (token ids), 'text_input' or "
                          "'messages'")
    stray = sorted(set(inputs) & set(TEXT_INPUTS))
    if stray:
        raise invalid_arg(f"input(s) {', '.join(stray)} belong to the text form; an input_ids "
                          f"request uses request_output_len, stop_words_list, runtime_top_k, ...")
    return tensor_request(inputs, exclude_input, bounds)


def split_batch(inputs: dict[str, npt.NDArray[Any]], batching: bool,
                max_batch_size: int = 0) -> list[dict[str, npt.NDArray[Any]]]:
    """The request's inputs -> one dict per batch item (each input's row, batch dimension
    dropped); the inputs as they are when the model does not batch. Raises INVALID_ARG naming
    the input: no batch dimension, sizes that differ, a size outside 1..``max_batch_size``
    (0: unchecked), ``input_lengths`` missing for several ``input_ids`` rows."""
    arrays = {name: np.asarray(array) for name, array in inputs.items()}
    if not batching:
        return [arrays]
    for name, array in arrays.items():
        if array.ndim == 0:
            raise invalid_arg(f"input '{name}' needs a batch dimension (the model batches), "
                              f"got shape []")
    if not arrays:
        return [arrays]
    leader = next((name for name in PROMPT_INPUTS if name in arrays), next(iter(arrays)))
    size = int(arrays[leader].shape[0])
    if size < 1:
        raise invalid_arg(f"input '{leader}': the batch size must be at least 1, got shape "
                          f"{list(arrays[leader].shape)}")
    if max_batch_size > 0 and size > max_batch_size:
        raise invalid_arg(f"input '{leader}': batch size {size} exceeds the model's "
                          f"max_batch_size {max_batch_size}")
    for name, array in arrays.items():
        if array.shape[0] != size:
            raise invalid_arg(f"input '{name}': batch size {array.shape[0]} differs from "
                              f"{leader}'s {size}")
    if size > 1 and "input_ids" in arrays and "input_lengths" not in arrays:
        raise invalid_arg("input 'input_lengths' is required when input_ids holds several rows "
                          "(one per batch item, padded to the longest)")
    return [{name: array[index] for name, array in arrays.items()} for index in range(size)]


def client_message(message: str, field_names: dict[str, str]) -> str:
    """An executor validation message in the client's names (``max_tokens`` ->
    ``request_output_len`` for the tensor form, ...)."""
    for executor_name, client_name in sorted(field_names.items(), key=lambda kv: -len(kv[0])):
        message = message.replace(executor_name, client_name)
    return message


# ------------------------------------------------------------------ responses


def tensor_outputs(result: Result, *, batching: bool, pad_id: int) -> list[OutputTensor]:
    """``output_ids`` [beams, len] (shorter beams padded with ``pad_id``), ``sequence_length``,
    ``cum_log_probs`` and ``output_log_probs`` [beams, generated] (zeros / empty when not asked
    for); with a leading batch dimension of 1 when the model batches."""
    beams = result.output_token_ids
    width = max((len(b) for b in beams), default=0)
    ids = np.full((len(beams), width), pad_id, dtype=np.int32)
    for row, beam in enumerate(beams):
        ids[row, :len(beam)] = beam
    per_beam = result.log_probs or [[] for _ in beams]  # generated tokens only
    log_probs = np.zeros((len(beams), max((len(v) for v in per_beam), default=0)), np.float32)
    for row, values in enumerate(per_beam):
        log_probs[row, :len(values)] = values
    lengths = np.array([len(b) for b in beams], dtype=np.int32)
    cum = np.array(result.cum_log_probs or [0.0] * len(beams), dtype=np.float32)
    outputs = [OutputTensor("output_ids", "INT32", ids),
               OutputTensor("sequence_length", "INT32", lengths),
               OutputTensor("cum_log_probs", "FP32", cum),
               OutputTensor("output_log_probs", "FP32", log_probs)]
    return with_batch_dimension(outputs, batching)


def with_batch_dimension(outputs: list[OutputTensor], batching: bool) -> list[OutputTensor]:
    """``outputs`` (one item's, unbatched) with a leading batch dimension of 1 when the model
    batches, else as they are."""
    if not batching:
        return outputs
    return [OutputTensor(t.name, t.datatype, t.array[np.newaxis]) for t in outputs]


def batch_index_output(indices: Sequence[int], *, batching: bool) -> OutputTensor:
    """``batch_index`` INT32 [len(indices), 1] (or [len] when the model does not batch): the
    batch item each row of the response belongs to."""
    array = np.array(indices, dtype=np.int32)
    return OutputTensor(BATCH_INDEX, "INT32", array[:, np.newaxis] if batching else array)


def stack_items(items: Sequence[Sequence[OutputTensor]],
                pad_ids: Sequence[int]) -> list[OutputTensor]:
    """Several items' unbatched outputs (the same names, in the same order, in each) -> one
    output per name with a leading batch dimension, every item padded at the end of each
    dimension to the largest: ``output_ids`` with its item's entry of ``pad_ids``, other
    numbers with 0, BYTES with ``b""``."""
    stacked: list[OutputTensor] = []
    for column, first in enumerate(items[0]):
        arrays = [np.asarray(item[column].array) for item in items]
        if any(item[column].name != first.name for item in items) or \
                len({a.ndim for a in arrays}) != 1:
            raise ValueError(f"batch items disagree on output '{first.name}'")
        shape = tuple(max(sizes) for sizes in zip(*(a.shape for a in arrays), strict=True))
        out = np.empty((len(arrays), *shape), dtype=arrays[0].dtype)
        for row, array in enumerate(arrays):
            fill: Any = pad_ids[row] if first.name == "output_ids" else (
                b"" if first.datatype == "BYTES" else 0)
            out[row] = fill
            out[row][tuple(slice(0, n) for n in array.shape)] = array
        stacked.append(OutputTensor(first.name, first.datatype, out))
    return stacked


COUNT_OUTPUTS = ("prompt_tokens", "completion_tokens", "finish_reason")
_FINISH_REASONS = {FinishReason.NOT_FINISHED: "", FinishReason.END_ID: "stop",
                   FinishReason.STOP_WORDS: "stop", FinishReason.LENGTH: "length",
                   FinishReason.TIMED_OUT: "timed_out", FinishReason.CANCELLED: "cancelled"}


@dataclass(frozen=True)
class TextCounts:
    """What ``prompt_tokens`` / ``completion_tokens`` / ``finish_reason`` report."""

    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason


def text_output(text: str, *, batching: bool, counts: TextCounts | None = None,
                requested: list[str] | tuple[str, ...] = ()) -> list[OutputTensor]:
    """``text_output``, plus those of ``COUNT_OUTPUTS`` named in ``requested`` (``counts``
    must then be given)."""
    outputs: list[tuple[str, str, npt.NDArray[Any]]] = [
        ("text_output", "BYTES", np.array([text.encode("utf-8")], dtype=np.object_))]
    if counts is not None:  # only those asked for: this runs for every streamed token
        for name in COUNT_OUTPUTS:
            if name not in requested:
                continue
            if name == "finish_reason":
                outputs.append((name, "BYTES", np.array(
                    [_FINISH_REASONS[counts.finish_reason].encode()], dtype=np.object_)))
            else:
                outputs.append((name, "INT32", np.array([getattr(counts, name)], np.int32)))
    return [OutputTensor(name, datatype, array[np.newaxis] if batching else array)
            for name, datatype, array in outputs]
