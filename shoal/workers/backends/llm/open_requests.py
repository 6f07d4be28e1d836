"""The client requests an ``llm`` model has open on its executor, and opening one
(docs/architecture.md §7, the llm backend).

A client request of N batch items (``interface.parse_requests``) becomes N executor requests
that share one ``OpenBatch``, which counts the items still running and, when the batch is not
streamed, holds each finished item's outputs until the last one ends. Each item is an
``OpenRequest``: the worker's request id (every item has it: responses and cancellation reach
them all), its place in the batch, its executor id once enqueued, its streaming detokenizer
and its metrics clock.

Opening (``backend.LlmBackend`` enqueues what these return, under its lock):
- ``refusal_not_decoupled``: TensorRT-LLM's rules (and messages) for a model that is not
  decoupled: one sequence per request, no streaming;
- ``open_batch``: the batch of parsed items; ``batch_index`` is sent when the request names it
  among its outputs, or names none, N > 1 and the model declares it;
- ``open_item``: one item checked (a streamed text answer needs one beam; the executor's
  limits, ``Executor.check_request``, which compiles a guided grammar) -> its ``OpenRequest``,
  or the INVALID_ARG Error (prefixed ``batch item i:`` when N > 1) that refuses the request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shoal.errors import ErrorCode
from shoal.llm import Executor
from shoal.messages import Error
from shoal.workers.backends.base import BackendRequest, OutputTensor
from shoal.workers.backends.llm.detokenize import IncrementalDetokenizer
from shoal.workers.backends.llm.figures import RequestClock
from shoal.workers.backends.llm.interface import BATCH_INDEX, COUNT_OUTPUTS, client_message
from shoal.workers.backends.llm.logits import TokenLogprobs, want_token_logprobs
from shoal.workers.backends.llm.request_forms import ParsedRequest

if TYPE_CHECKING:
    from tokenizers import Tokenizer


@dataclass
class OpenBatch:
    """The executor requests of one client request, one per batch item."""

    size: int
    streaming: bool
    batch_index: bool  # responses carry batch_index
    pending: int  # items whose final result has not arrived yet
    pad_ids: list[int]
    held: list[list[OutputTensor] | None]  # non-streaming, N > 1: each finished item's outputs
    clocks: list[RequestClock | None]  # non-streaming, N > 1: counted when the answer leaves
    failed: bool = False  # an item failed: its error was sent, the others were cancelled


@dataclass
class OpenRequest:
    worker_id: int  # the worker's request id (send_response / is_cancelled)
    parsed: ParsedRequest
    batch: OpenBatch
    index: int = 0  # the item's place in its batch
    executor_id: int = 0
    detokenizer: IncrementalDetokenizer | None = None
    cancelled: bool = False
    counted_outputs: tuple[str, ...] = ()  # of COUNT_OUTPUTS, those the client asked for
    generated: int = 0  # tokens generated so far (beam 0), for completion_tokens
    clock: RequestClock | None = None  # metrics: its timeline and tokens (figures.py)
    logprobs: TokenLogprobs | None = None  # set when the client asked for token_logprobs


def refusal_not_decoupled(items: list[ParsedRequest]) -> Error | None:
    """Not decoupled: TensorRT-LLM's rules (and messages) for this mode."""
    if len(items) > 1:
        return Error(ErrorCode.INVALID_ARG, "Batch size > 1 requires the tensorrt_llm "
                     "backend to be using decoupled transaction policy")
    if items[0].request.streaming:
        return Error(ErrorCode.INVALID_ARG, "Streaming is only supported if model is "
                     "deployed using decoupled mode.")
    return None


def open_batch(items: list[ParsedRequest], requested_outputs: list[str], *,
               declares_batch_index: bool, eos: int | None) -> OpenBatch:
    several = len(items) > 1
    return OpenBatch(len(items), items[0].request.streaming,
                     BATCH_INDEX in requested_outputs or (
                         not requested_outputs and several and declares_batch_index),
                     len(items), [pad_id(p, eos) for p in items], [None] * len(items),
                     [None] * len(items))


def open_item(request: BackendRequest, parsed: ParsedRequest, batch: OpenBatch, index: int, *,
              executor: Executor, tokenizer: Tokenizer | None,
              token_logprobs: TokenLogprobs | None) -> OpenRequest | Error:
    """Item ``index`` of ``request`` checked and made ready to enqueue, or why it cannot run."""
    prefix = f"batch item {index}: " if batch.size > 1 else ""
    if parsed.text_form and parsed.request.streaming and \
            parsed.request.sampling_config.beam_width > 1:
        return Error(ErrorCode.INVALID_ARG, f"{prefix}input 'beam_width' > 1 cannot "
                     f"stream text (beams change as the search goes); set stream false")
    wants_logprobs = parsed.text_form and want_token_logprobs(parsed.request,
                                                              request.requested_outputs)
    problem = executor.check_request(parsed.request)  # compiles a guided grammar
    if problem is not None:
        return Error(ErrorCode.INVALID_ARG, prefix + client_message(problem, parsed.field_names))
    counted = tuple(name for name in COUNT_OUTPUTS if name in request.requested_outputs)
    open_request = OpenRequest(request.request_id, parsed, batch, index, counted_outputs=counted)
    if wants_logprobs:
        open_request.logprobs = token_logprobs
    if parsed.text_form and parsed.request.streaming:
        assert tokenizer is not None
        open_request.detokenizer = IncrementalDetokenizer(tokenizer,
                                                          parsed.request.input_token_ids)
    parsed.request.client_id = request.request_id
    return open_request


def pad_id(parsed: ParsedRequest, eos: int | None) -> int:
    """The item's pad id: its ``pad_id``, else its end id, else the checkpoint's eos, else 0."""
    request = parsed.request
    for candidate in (request.pad_id, request.end_id, eos):
        if candidate is not None:
            return candidate
    return 0
