"""Running the logits post-processors over one iteration's logits (executor loop thread).

``LogitsPostProcessing.apply`` gets the iteration's logits [rows, vocab] and, for each scheduled
request, the rows holding its running sequences' next-token logits. For each request that names
a processor it gathers those rows, calls the processor and writes the result back in place, so
everything after it (penalties, guided bitmask, token choice, log-probabilities) sees the
processed logits. A processor that raises fails only the requests it was called for (all of
the batched call's requests when the batched processor raises); the others continue.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from shoal.llm.logits.config import (
    BATCHED_POST_PROCESSOR_NAME,
    LogitsPostProcessorConfig,
)

if TYPE_CHECKING:
    from shoal.llm.sequence import RequestState

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcessedRequest:
    """One scheduled request as a processor sees it."""

    request_id: int
    client_id: int | None
    processor_name: str
    rows: list[int]  # its rows in the iteration's logits, one per running sequence
    ids: list[list[int]]  # tokens so far of each of those sequences


class LogitsPostProcessing:
    def __init__(self, config: LogitsPostProcessorConfig | None) -> None:
        self._map = dict(config.processor_map or {}) if config is not None else {}
        self._batched = config.processor_batched if config is not None else None
        self.names = config.names if config is not None else frozenset()

    def apply_to_iteration(self, logits: torch.Tensor, scheduled: Sequence[RequestState],
                           last_row: dict[int, int]) -> dict[int, str]:
        """``apply`` for the engine: ``last_row`` maps ``id(sequence)`` to its row in
        ``logits``. Requests that name no processor are skipped at once."""
        if not self.names:
            return {}
        requests = [
            ProcessedRequest(state.request_id, state.request.client_id,
                             state.request.logits_post_processor_name,
                             [last_row[id(s)] for s in state.active],
                             [list(s.tokens) for s in state.active])
            for state in scheduled if state.request.logits_post_processor_name is not None]
        with torch.inference_mode():  # the model's logits are inference tensors
            return self.apply(logits, requests)

    def apply(self, logits: torch.Tensor, requests: Sequence[ProcessedRequest]
              ) -> dict[int, str]:
        """Run every named processor on ``logits`` (changed in place). Returns request id ->
        error message for the requests whose processor failed."""
        failed: dict[int, str] = {}
        if not requests:
            return failed
        stream = _stream_pointer(logits)
        batched: list[ProcessedRequest] = []
        for request in requests:
            if request.processor_name == BATCHED_POST_PROCESSOR_NAME:
                batched.append(request)
                continue
            processor = self._map[request.processor_name]  # names are checked at enqueue
            view = logits[request.rows]
            try:
                returned = processor(request.request_id, view, request.ids, stream,
                                     request.client_id)
                _write_back(logits, request.rows, view, returned)
            except Exception as exc:
                failed[request.request_id] = _failure(request.processor_name, exc)
        if batched and self._batched is not None:
            views = [logits[r.rows] for r in batched]
            try:
                returned_list = self._batched([r.request_id for r in batched], views,
                                              [r.ids for r in batched], stream,
                                              [r.client_id for r in batched])
                for index, (request, view) in enumerate(zip(batched, views, strict=True)):
                    returned = None if returned_list is None else returned_list[index]
                    _write_back(logits, request.rows, view, returned)
            except Exception as exc:
                message = _failure(BATCHED_POST_PROCESSOR_NAME, exc)
                failed.update((r.request_id, message) for r in batched)
        return failed


def _write_back(logits: torch.Tensor, rows: list[int], view: torch.Tensor,
                returned: object) -> None:
    if returned is not None and returned is not view:
        if not isinstance(returned, torch.Tensor):
            raise TypeError(f"returned {type(returned).__name__}, expected None (logits changed "
                            f"in place) or a tensor")
        if returned.shape != view.shape:
            raise ValueError(f"returned a tensor of shape {list(returned.shape)}, expected "
                             f"{list(view.shape)}")
        view = returned
    logits[rows] = view.to(device=logits.device, dtype=logits.dtype)


def _failure(name: str, exc: Exception) -> str:
    logger.warning("logits post-processor '%s' failed", name, exc_info=exc)
    return f"logits post-processor '{name}' failed: {type(exc).__name__}: {exc}"


def _stream_pointer(logits: torch.Tensor) -> int:
    if logits.device.type == "cuda":
        return int(torch.cuda.current_stream(logits.device).cuda_stream)
    return 0
