"""Model implementations behind one seam: ``CausalLM.forward(batch of sequences, block tables)
-> logits``. ``load_model`` picks the implementation from ``config.json``."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from shoal.errors import invalid_arg
from shoal.llm.attention import AttentionBatch
from shoal.llm.checkpoint import ModelSpec, load_weights, read_model_spec
from shoal.llm.kv_cache import KvCachePool

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16}


class CausalLM(Protocol):
    spec: ModelSpec
    dtype: torch.dtype

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                kv: KvCachePool, logits_rows: torch.Tensor) -> torch.Tensor:
        """Compute the packed tokens (writing their keys/values into ``kv`` at
        ``batch.slot_mapping``) and return float32 logits of the packed rows ``logits_rows``,
        [len(logits_rows), vocab]."""
        ...


def resolve_dtype(spec: ModelSpec, device: str, requested: str | None) -> torch.dtype:
    """``requested`` when given; else float32 on CPU and the checkpoint's dtype elsewhere."""
    if requested is not None:
        try:
            return TORCH_DTYPES[requested]
        except KeyError:
            raise invalid_arg(f"ExecutorConfig.dtype {requested!r} is not one of "
                              f"{', '.join(TORCH_DTYPES)}") from None
    if torch.device(device).type == "cpu":
        return torch.float32
    return TORCH_DTYPES[spec.checkpoint_dtype]


def load_model(model_dir: str | Path, device: str, dtype: str | None = None) -> CausalLM:
    from shoal.llm.models.gpt2 import Gpt2Model
    from shoal.llm.models.llama import LlamaModel

    spec = read_model_spec(model_dir)
    torch_dtype = resolve_dtype(spec, device, dtype)
    weights = load_weights(model_dir, device, torch_dtype)
    if spec.architecture == "gpt2":
        return Gpt2Model(spec, weights, device, torch_dtype)
    return LlamaModel(spec, weights, device, torch_dtype)
