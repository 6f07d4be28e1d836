"""The KV pool's size rules from the llm backend's parameters, shared by the backend
(``settings``) and the broker's device-memory ledger (``device_need.py``). Torch-free:
the broker imports it.

``kv_cache_free_gpu_mem_fraction`` sizes the pool at ``fraction`` of the device memory left free
once the weights are loaded, in whole blocks; with ``max_tokens_in_paged_kv_cache`` given too,
the pool is the smaller of the two, as TensorRT-LLM sizes it. A pool given in tokens is rounded
up to whole blocks (as the executor rounds ``KvCacheConfig.max_tokens``).
"""

from __future__ import annotations

import math


def blocks_for_tokens(tokens: int, tokens_per_block: int) -> int:
    """The blocks that hold ``tokens`` tokens (rounded up)."""
    return math.ceil(tokens / tokens_per_block)


def fraction_blocks(fraction: float, free_bytes: int, weight_bytes: int, block_bytes: int,
                    max_tokens: int | None, tokens_per_block: int) -> int:
    """The blocks of ``block_bytes`` in ``fraction`` of what ``weight_bytes`` leave of
    ``free_bytes``; at most the blocks of ``max_tokens`` when given (the smaller pool)."""
    blocks = int(max(0, free_bytes - weight_bytes) * fraction) // block_bytes
    if max_tokens is not None:
        blocks = min(blocks, blocks_for_tokens(max_tokens, tokens_per_block))
    return blocks
