"""Request checks for this room's fields: ``logits_post_processor_name`` must name a processor
of the executor, ``output_config.num_top_log_probs`` must fit the vocabulary (and beam search
does not report alternatives)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shoal.llm.limits import Limits
    from shoal.llm.request import Request


def logits_request_error(request: Request, limits: Limits) -> str | None:
    name = request.logits_post_processor_name
    if name is not None and name not in limits.logits_post_processors:
        known = ", ".join(sorted(limits.logits_post_processors)) or "none"
        return (f"logits_post_processor_name '{name}' is not a logits post-processor of this "
                f"model (known: {known})")
    count = request.output_config.num_top_log_probs
    if isinstance(count, bool) or not isinstance(count, int) or \
            not 0 <= count <= limits.vocab_size:
        return (f"output_config.num_top_log_probs must be an integer in 0..{limits.vocab_size}, "
                f"got {count!r}")
    if count and request.sampling_config.beam_width > 1:
        return "output_config.num_top_log_probs needs beam_width 1 (beam search reports none)"
    return None
