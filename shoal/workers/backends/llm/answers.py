"""The responses of an ``llm`` model's open requests, built from the executor's results
(docs/architecture.md §7, the llm backend; the tensors: ``interface.py``).

- ``item_outputs``: one item's outputs for one executor ``Result``, without a batch dimension:
  the tensor form's ``output_ids`` ... (padded with the item's pad id), or the text form's
  ``text_output`` (streamed: the detokenizer's next piece, None while a piece is held back so a
  character never splits; else the whole decoded sequence), plus the ``COUNT_OUTPUTS`` the
  client asked for and ``token_logprobs``. It advances the item's generated-token count.
- ``item_response``: an item's outputs as a response of its own (a batch dimension of 1 when
  the model batches, and ``batch_index`` when its batch sends it).
- ``stacked_response``: the one response of a batch that is not streamed: every item's
  outputs stacked (``interface.stack_items``), with ``batch_index`` 0..N-1 when sent; raises
  when the items' outputs disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from shoal.llm import FinishReason, Result
from shoal.workers.backends.base import BackendResponse, OutputTensor
from shoal.workers.backends.llm.interface import (
    TextCounts,
    batch_index_output,
    stack_items,
    tensor_outputs,
    text_output,
    with_batch_dimension,
)
from shoal.workers.backends.llm.open_requests import OpenBatch, OpenRequest

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def item_outputs(open_request: OpenRequest, result: Result, final: bool, *,
                 exclude_input: bool, tokenizer: Tokenizer | None) -> list[OutputTensor] | None:
    """The item's outputs for ``result`` (no batch dimension); None when a streamed text
    piece is held back."""
    parsed = open_request.parsed
    if not parsed.text_form:
        return tensor_outputs(result, batching=False,
                              pad_id=open_request.batch.pad_ids[open_request.index])
    beams = result.output_token_ids
    tokens = beams[0] if beams else []
    request = parsed.request
    if request.streaming:
        open_request.generated += len(tokens)
    else:  # the whole sequence, after the prompt unless that is excluded
        open_request.generated = len(tokens) - (
            0 if exclude_input else len(request.input_token_ids))
    if open_request.detokenizer is not None:
        text = open_request.detokenizer.push(tokens)
        if final:
            text += open_request.detokenizer.flush()
        if not text and not final and open_request.logprobs is None:
            return None
    else:
        assert tokenizer is not None
        text = tokenizer.decode(tokens, skip_special_tokens=True)
    if not open_request.counted_outputs:
        outputs = text_output(text, batching=False)
    else:
        reason = (result.finish_reasons[0] if final and result.finish_reasons
                  else FinishReason.NOT_FINISHED)
        counts = TextCounts(len(request.input_token_ids),
                            open_request.generated + (reason is FinishReason.END_ID), reason)
        outputs = text_output(text, batching=False, counts=counts,
                              requested=open_request.counted_outputs)
    if open_request.logprobs is not None:
        outputs.append(open_request.logprobs.output(result, batching=False))
    return outputs


def item_response(open_request: OpenRequest, outputs: list[OutputTensor], *,
                  batching: bool) -> BackendResponse:
    """One item's outputs as a response of its own."""
    tensors = with_batch_dimension(outputs, batching)
    if open_request.batch.batch_index:
        tensors.append(batch_index_output([open_request.index], batching=batching))
    return BackendResponse(tensors)


def stacked_response(batch: OpenBatch,
                     items: Sequence[Sequence[OutputTensor]]) -> BackendResponse:
    """The response of a non-streaming batch: ``items`` (every item's outputs) stacked."""
    tensors = stack_items(items, batch.pad_ids)
    if batch.batch_index:
        tensors.append(batch_index_output(range(batch.size), batching=True))
    return BackendResponse(tensors)
