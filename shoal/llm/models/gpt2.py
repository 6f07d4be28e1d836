"""GPT-2 decoder (learned positions, LayerNorm, fused qkv Conv1D, GELU MLP) over a paged KV
cache. Conv1D weights are [in, out] and applied with ``addmm`` as Hugging Face does; the LM head
is tied to the token embedding."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from shoal.llm.attention import AttentionBatch, paged_attention
from shoal.llm.checkpoint import ModelSpec
from shoal.llm.kv_cache import KvCachePool
from shoal.llm.models.layers import activation, take


@dataclass(frozen=True)
class _Layer:
    ln_1: tuple[torch.Tensor, torch.Tensor]
    c_attn: tuple[torch.Tensor, torch.Tensor]
    attn_proj: tuple[torch.Tensor, torch.Tensor]
    ln_2: tuple[torch.Tensor, torch.Tensor]
    c_fc: tuple[torch.Tensor, torch.Tensor]
    mlp_proj: tuple[torch.Tensor, torch.Tensor]
    attention_scale: float


class Gpt2Model:
    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], device: str,
                 dtype: torch.dtype) -> None:
        self.spec = spec
        self.dtype = dtype
        self._act = activation(spec.hidden_act)
        # GPT2LMHeadModel saves "transformer.*"; the original GPT2Model checkpoints do not.
        weights = {name.removeprefix("transformer."): t for name, t in weights.items()}
        self._wte = take(weights, "wte.weight")
        self._wpe = take(weights, "wpe.weight")
        self._ln_f = (take(weights, "ln_f.weight"), take(weights, "ln_f.bias"))
        self._layers = [self._load_layer(weights, i) for i in range(spec.num_layers)]

    def _load_layer(self, weights: dict[str, torch.Tensor], index: int) -> _Layer:
        prefix = f"h.{index}."

        def pair(name: str) -> tuple[torch.Tensor, torch.Tensor]:
            return take(weights, prefix + name + ".weight"), take(weights, prefix + name + ".bias")

        scale = self.spec.attention_scale
        if self.spec.scale_attn_by_inverse_layer_idx:
            scale /= float(index + 1)
        return _Layer(ln_1=pair("ln_1"), c_attn=pair("attn.c_attn"),
                      attn_proj=pair("attn.c_proj"), ln_2=pair("ln_2"), c_fc=pair("mlp.c_fc"),
                      mlp_proj=pair("mlp.c_proj"), attention_scale=scale)

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                kv: KvCachePool, logits_rows: torch.Tensor) -> torch.Tensor:
        """token_ids / positions [T] of the packed batch; returns float32 logits
        [len(logits_rows), vocab] for the packed rows asked for."""
        spec = self.spec
        hidden = F.embedding(token_ids, self._wte) + F.embedding(positions, self._wpe)
        shape = (-1, spec.num_heads, spec.head_dim)
        for index, layer in enumerate(self._layers):
            normed = self._layer_norm(hidden, layer.ln_1)
            qkv = _conv1d(normed, layer.c_attn)
            query, key, value = torch.split(qkv, spec.hidden_size, dim=-1)
            attended = paged_attention(query.reshape(shape), key.reshape(shape),
                                       value.reshape(shape), kv.layer(index), batch,
                                       layer.attention_scale, index)
            hidden = hidden + _conv1d(attended.reshape(-1, spec.hidden_size), layer.attn_proj)
            normed = self._layer_norm(hidden, layer.ln_2)
            hidden = hidden + _conv1d(self._act(_conv1d(normed, layer.c_fc)), layer.mlp_proj)
        selected = self._layer_norm(hidden[logits_rows], self._ln_f)
        return F.linear(selected, self._wte).float()

    def _layer_norm(self, hidden: torch.Tensor,
                    params: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.layer_norm(hidden, (self.spec.hidden_size,), params[0], params[1],
                            self.spec.norm_eps)


def _conv1d(hidden: torch.Tensor, params: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    weight, bias = params
    return torch.addmm(bias, hidden, weight)
