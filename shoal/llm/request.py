"""Requests and responses of the executor, named and shaped like TensorRT-LLM's Python bindings
(``tensorrt_llm.bindings.executor``: Request, SamplingConfig, OutputConfig, Response, Result,
FinishReason).

Token conventions (TRT-LLM's): ``output_token_ids`` never contains the end id that finished a
sequence; a stop word that finished a sequence is kept. A non-streaming result holds the prompt
followed by the generated tokens unless ``OutputConfig.exclude_input_from_output``; a streaming
result holds only the tokens generated since the previous result of that sequence (all
generated tokens so far with ``return_all_generated_tokens``, and always for beam search, where
earlier tokens of a beam can change).

``is_final`` / ``is_sequence_final`` / ``sequence_index`` follow TRT-LLM's Executor
documentation: with beam search (``beam_width > 1``) one result carries the best
``num_return_sequences`` beams and ``sequence_index`` is always 0; with sampling every returned
sequence has its own results (``0 <= sequence_index < num_return_sequences``), each with its own
``is_sequence_final``, and ``is_final`` is set only on the last result of the request, once
every sequence has finished.
"""

from __future__ import annotations

import enum
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import torch

    from shoal.llm.guided.params import GuidedDecodingParams


class FinishReason(enum.Enum):
    NOT_FINISHED = 0
    END_ID = 1
    STOP_WORDS = 2
    LENGTH = 3
    TIMED_OUT = 4
    CANCELLED = 5


@dataclass
class SamplingConfig:
    """Decoding parameters. None means the default noted.

    - Greedy (argmax) when ``temperature`` is 0, or ``top_k`` is 1, or neither ``top_k`` nor
      ``top_p`` is set (TRT-LLM's rule); otherwise sampling with temperature (default 1.0),
      top-k (0 = off) and top-p (0 or 1 = off).
    - ``seed`` (default 0) seeds a generator owned by each sequence, so a request samples the
      same tokens whatever else shares its batch.
    - Penalties count every token of the prompt and the output: ``repetition_penalty`` divides
      positive / multiplies negative logits of seen tokens (1.0 = off), ``presence_penalty`` is
      subtracted once per seen token, ``frequency_penalty`` once per occurrence.
    - Beam search (``beam_width > 1``) is deterministic and follows Hugging Face
      ``generate(num_beams=..., do_sample=False)``: scores are summed log-probabilities, a
      finished beam ranks by ``score / generated_length ** length_penalty`` (default 0.0, as in
      TRT-LLM), ``early_stopping`` 1 (default) stops once ``beam_width`` beams have finished,
      0 stops when no running beam can still beat the finished ones at its current length
      (HF's ``early_stopping=False``), -1 never stops early (HF's ``"never"``).
      Temperature, top-k and top-p do not apply to beam search.
    - ``min_tokens`` (default 0): the end id cannot be chosen before this many tokens have been
      generated (HF's ``min_new_tokens``).
    """

    beam_width: int = 1
    _: KW_ONLY
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    early_stopping: int | None = None
    num_return_sequences: int | None = None


@dataclass
class OutputConfig:
    """``return_log_probs``: log-probabilities of the output tokens under the distribution they
    were chosen from (after penalties and temperature, before top-k / top-p truncation).
    ``return_context_logits``: the model's logits for every prompt position, in the request's
    first result. ``return_generation_logits``: raw logits for each token of a result (not for
    beam search)."""

    return_log_probs: bool = False
    return_context_logits: bool = False
    return_generation_logits: bool = False
    exclude_input_from_output: bool = False
    # shoal extension: this many most likely alternatives of each output token, with their
    # log-probabilities on the same distribution as ``return_log_probs`` (logits/top_log_probs.py)
    num_top_log_probs: int = 0


@dataclass
class Request:
    """One generation request. ``bad_words`` / ``stop_words`` are token sequences: a bad word's
    last token is banned wherever the tokens before it end the sequence so far; a sequence ends
    (FinishReason.STOP_WORDS) as soon as its generated tokens end with a stop word.
    ``num_return_sequences`` here is TRT-LLM's older spelling; ``SamplingConfig``'s wins when
    set."""

    input_token_ids: list[int]
    max_tokens: int
    _: KW_ONLY
    streaming: bool = False
    sampling_config: SamplingConfig = field(default_factory=SamplingConfig)
    output_config: OutputConfig = field(default_factory=OutputConfig)
    end_id: int | None = None
    pad_id: int | None = None
    bad_words: list[list[int]] | None = None
    stop_words: list[list[int]] | None = None
    client_id: int | None = None
    return_all_generated_tokens: bool = False
    num_return_sequences: int = 1
    # the output follows a JSON schema / regex / grammar (guided/decoder.py; needs end_id)
    guided_decoding_params: GuidedDecodingParams | None = None
    # a processor of ExecutorConfig.logits_post_processor_config ("batched": the batched one)
    logits_post_processor_name: str | None = None

    BATCHED_POST_PROCESSOR_NAME: ClassVar[str] = "batched"

    @property
    def effective_num_return_sequences(self) -> int:
        configured = self.sampling_config.num_return_sequences
        return self.num_return_sequences if configured is None else configured


@dataclass
class Result:
    """Tokens and metadata of one response. Lists indexed by beam hold one entry per returned
    beam (beam search) or exactly one entry (sampling; see ``sequence_index``).
    ``cum_log_probs`` includes the end id's log-probability when a sequence ended on it;
    ``log_probs`` is aligned with ``output_token_ids`` (generated tokens only)."""

    is_final: bool
    output_token_ids: list[list[int]]
    finish_reasons: list[FinishReason]
    sequence_index: int = 0
    is_sequence_final: bool = False
    cum_log_probs: list[float] | None = None
    log_probs: list[list[float]] | None = None
    context_logits: torch.Tensor | None = None
    generation_logits: torch.Tensor | None = None
    decoding_iter: int = 0
    # with OutputConfig.num_top_log_probs: per beam, per output token, (token id, log-prob) pairs
    # most likely first; aligned with ``log_probs``
    top_log_probs: list[list[list[tuple[int, float]]]] | None = None


@dataclass
class Response:
    """Either ``error_msg`` (the request failed; no more responses follow) or ``result``."""

    request_id: int
    result: Result | None = None
    error_msg: str | None = None
    client_id: int | None = None

    def has_error(self) -> bool:
        return self.error_msg is not None
