"""The most likely alternatives of each chosen token (``OutputConfig.num_top_log_probs``, a shoal
extension; OpenAI's ``top_logprobs``).

They come from the same distribution the token is drawn from and its reported log-probability
is taken on (``sampling.py``): the log-softmax of the row after the logits post-processors,
penalties, bad words and ``min_tokens``, divided by the temperature when sampling (before top-k
/ top-p truncation). So under greedy decoding the chosen token is the first alternative, with the
same log-probability.
"""

from __future__ import annotations

import torch

from shoal.llm.sampling import TokenRow, process_logits

TopLogProbs = list[tuple[int, float]]  # (token id, log-probability), most likely first


def chosen_distribution(logits: torch.Tensor, row: TokenRow) -> torch.Tensor:
    """Log-probabilities [V] that ``choose_tokens`` chooses ``row``'s token from."""
    params = row.params
    if params.processes_logits:
        logits = process_logits(logits, params, row.tokens, row.num_generated)
    if not params.greedy:
        logits = logits / params.temperature
    return torch.log_softmax(logits, dim=-1)


def top_log_probs(logits: torch.Tensor, rows: list[TokenRow], count: int) -> list[TopLogProbs]:
    """The ``count`` most likely tokens of each row of ``logits`` [N, V]."""
    if count <= 0:
        return [[] for _ in rows]
    count = min(count, logits.shape[-1])
    distributions = torch.stack([chosen_distribution(logits[i], row)
                                 for i, row in enumerate(rows)])
    values, indices = torch.topk(distributions, count, dim=-1, sorted=True)
    return [list(zip(ids, lps, strict=True))
            for ids, lps in zip(indices.tolist(), values.tolist(), strict=True)]
