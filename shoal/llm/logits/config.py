"""``LogitsPostProcessorConfig``, named and shaped like TensorRT-LLM's executor bindings.

- A per-request processor is called as ``fn(req_id, logits, ids, stream_ptr, client_id)`` once
  per iteration for each request that names it (``Request.logits_post_processor_name``).
  ``logits`` is a [num_sequences, vocab] tensor on the executor's device (one row per running
  beam / returned sequence of the request) that the processor changes in place (returning a
  tensor of that shape instead is accepted too); ``ids`` holds each of those sequences' tokens
  so far (prompt + generated); ``stream_ptr`` is the CUDA stream the logits live on (0 on CPU);
  ``client_id`` is the request's ``client_id``.
- The batched processor is called once per iteration with lists over every request that named
  ``BATCHED_POST_PROCESSOR_NAME`` (``"batched"``, TRT-LLM's
  ``Request.BATCHED_POST_PROCESSOR_NAME``): ``fn(req_ids, logits_list, ids_list, stream_ptr,
  client_ids)``.
- ``replicate`` is kept for TRT-LLM compatibility; with one process per model instance there is
  nothing to replicate and it has no effect.

Processors run before the sampling parameters (penalties, bad words, temperature, top-k/p) and
before a guided-decoding bitmask, so log-probabilities and token choices see their result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import torch

BATCHED_POST_PROCESSOR_NAME: Final = "batched"

# (req_id, logits [num_sequences, vocab], ids per sequence, stream_ptr, client_id)
LogitsPostProcessor = Callable[
    [int, "torch.Tensor", list[list[int]], int, "int | None"], "torch.Tensor | None"]
# (req_ids, logits per request, ids per request per sequence, stream_ptr, client_ids)
LogitsPostProcessorBatched = Callable[
    [list[int], list["torch.Tensor"], list[list[list[int]]], int, list["int | None"]],
    "list[torch.Tensor] | None"]


@dataclass(frozen=True)
class LogitsPostProcessorConfig:
    processor_map: dict[str, LogitsPostProcessor] | None = None
    processor_batched: LogitsPostProcessorBatched | None = None
    replicate: bool = True

    def __post_init__(self) -> None:
        for name in self.processor_map or {}:
            if name == BATCHED_POST_PROCESSOR_NAME:
                raise ValueError(f"logits post-processor name '{name}' is reserved for the "
                                 f"batched processor (processor_batched)")
            if not name:
                raise ValueError("logits post-processor names must not be empty")

    @property
    def names(self) -> frozenset[str]:
        """Every name a request may give: the map's keys, and ``batched`` when set."""
        names = set(self.processor_map or {})
        if self.processor_batched is not None:
            names.add(BATCHED_POST_PROCESSOR_NAME)
        return frozenset(names)
