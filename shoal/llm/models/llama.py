"""Llama-family decoder (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU) over a
paged KV cache. Weights come from a ``LlamaForCausalLM`` checkpoint or one of its relatives, which
differ only by switches of ``ModelSpec``: ``MistralForCausalLM`` (no biases),
``Qwen2ForCausalLM`` (``qkv_bias``), ``Qwen3ForCausalLM`` (``qk_norm``), and Llama 3's
``rope_scaling``; sliding windows per layer (``ModelSpec.layer_windows``, see ``window.py``).
q/k/v and gate/up projections are concatenated at load so each layer runs two
matmuls fewer per iteration."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from shoal.llm.attention import AttentionBatch, kept_slots, paged_attention
from shoal.llm.checkpoint import ModelSpec
from shoal.llm.kernels import (
    LAYER_FIELDS,
    CpuKernels,
    DecodeShape,
    KeptRows,
    cpu_kernels,
)
from shoal.llm.kv_cache import KvCachePool
from shoal.llm.models.layers import Linear, activation, rms_norm, take
from shoal.llm.models.rope import RotaryTable, inverse_frequencies
from shoal.llm.window import layer_batches

# the compiled iteration's prompt attention reads a query's keys once per query (no tiling):
# longer prompts go layer by layer, through torch's flash attention kernel (at 1,000 tokens of
# the benchmark model both took ~104 ms; the quadratic part grows from there)
COMPILED_SPAN_MAX = 512


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.Tensor
    qkv: Linear
    q_norm: torch.Tensor | None  # [head_dim] when spec.qk_norm
    k_norm: torch.Tensor | None
    out: Linear
    post_norm: torch.Tensor
    gate_up: Linear
    down: Linear


class LlamaModel:
    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], device: str,
                 dtype: torch.dtype) -> None:
        self.spec = spec
        self.dtype = dtype
        self._act = activation(spec.hidden_act)
        self._swiglu = spec.hidden_act in ("silu", "swish")
        # compiled kernels between the matrix products: float32 on the CPU only (None: the
        # op-by-op loop; SHOAL_LLM_CPU_KERNELS=0 forces it)
        self._kernels = cpu_kernels() if dtype == torch.float32 and device == "cpu" else None
        self._embed = take(weights, "model.embed_tokens.weight")
        self._final_norm = take(weights, "model.norm.weight")
        if "lm_head.weight" in weights or not spec.tie_word_embeddings:
            self._lm_head = Linear(take(weights, "lm_head.weight"))
        else:
            self._lm_head = Linear(self._embed, share=True)
        self._layers = [self._load_layer(weights, i) for i in range(spec.num_layers)]
        inv_freq = inverse_frequencies(spec.head_dim, spec.rope_theta, spec.rope_scaling)
        self._rotary = RotaryTable(inv_freq, spec.max_position_embeddings, dtype, device)
        # a whole iteration in one compiled call, where the model allows it
        self._decode_shape, self._weight_ptrs = self._compiled_iteration()

    def _compiled_iteration(self) -> tuple[DecodeShape | None, list[list[int]]]:
        """What ``CpuKernels.llama_step`` needs (None when it cannot run this model: no
        kernels or BLAS, QK-norm, sliding windows, another activation), and each layer's weight
        addresses (``LAYER_FIELDS`` up to the per-iteration ones)."""
        spec, kernels = self.spec, self._kernels
        if (kernels is None or kernels.sgemm is None or spec.qk_norm or spec.layer_windows
                or not self._swiglu
                or not all(linear.transposed for layer in self._layers
                           for linear in (layer.qkv, layer.out, layer.gate_up, layer.down))):
            return None, []

        def address(tensor: torch.Tensor | None) -> int:
            if tensor is None:
                return 0
            assert tensor.is_contiguous() and tensor.dtype == torch.float32
            return tensor.data_ptr()

        pointers = [[address(t) for t in (
            layer.input_norm, layer.qkv.weight, layer.qkv.bias, layer.out.weight, layer.out.bias,
            layer.post_norm, layer.gate_up.weight, layer.gate_up.bias, layer.down.weight,
            layer.down.bias)] for layer in self._layers]
        assert len(pointers[0]) == len(LAYER_FIELDS) - 3  # + keys_t, values, pool per iteration
        shape = DecodeShape(
            hidden_size=self._embed.shape[1], heads=spec.num_heads, kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim, intermediate=self._layers[0].gate_up.weight.shape[1] // 2,
            vocab=self._lm_head.weight.shape[1 if self._lm_head.transposed else 0],
            eps=spec.norm_eps, scale=spec.attention_scale)
        return shape, pointers

    def _load_layer(self, weights: dict[str, torch.Tensor], index: int) -> _Layer:
        prefix = f"model.layers.{index}."
        attn, mlp = prefix + "self_attn.", prefix + "mlp."

        def optional(name: str, enabled: bool) -> torch.Tensor | None:
            return take(weights, name) if enabled else None

        qkv_bias = None
        if self.spec.qkv_bias:
            qkv_bias = torch.cat([take(weights, f"{attn}{p}_proj.bias") for p in "qkv"])
        gate_up_bias = None
        if self.spec.mlp_bias:
            gate_up_bias = torch.cat([take(weights, f"{mlp}{p}_proj.bias") for p in ("gate", "up")])
        return _Layer(
            input_norm=take(weights, prefix + "input_layernorm.weight"),
            qkv=Linear(torch.cat([take(weights, f"{attn}{p}_proj.weight") for p in "qkv"]),
                       qkv_bias),
            q_norm=optional(attn + "q_norm.weight", self.spec.qk_norm),
            k_norm=optional(attn + "k_norm.weight", self.spec.qk_norm),
            out=Linear(take(weights, attn + "o_proj.weight"),
                       optional(attn + "o_proj.bias", self.spec.out_proj_bias)),
            post_norm=take(weights, prefix + "post_attention_layernorm.weight"),
            gate_up=Linear(torch.cat([take(weights, f"{mlp}{p}_proj.weight")
                                      for p in ("gate", "up")]), gate_up_bias),
            down=Linear(take(weights, mlp + "down_proj.weight"),
                        optional(mlp + "down_proj.bias", self.spec.mlp_bias)),
        )

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                kv: KvCachePool, logits_rows: torch.Tensor) -> torch.Tensor:
        """token_ids / positions [T] of the packed batch; returns float32 logits
        [len(logits_rows), vocab] for the packed rows asked for."""
        spec = self.spec
        if (self._decode_shape is not None and not batch.extend_spans
                and (not batch.decode_rows.numel() or batch.decode_plan is not None)
                and all(end - start <= COMPILED_SPAN_MAX for start, end in batch.prefill_spans)):
            return self._compiled_step(token_ids, positions, batch, kv, logits_rows)
        hidden = F.embedding(token_ids, self._embed)
        q_size = spec.num_heads * spec.head_dim
        kv_size = spec.num_kv_heads * spec.head_dim
        cos_sin = self._rotary.at(positions)
        heads = spec.num_heads + spec.num_kv_heads
        # sliding windows (spec.layer_windows) folded into each layer's masks
        batches = (layer_batches(batch, spec.layer_windows, self.dtype) if spec.layer_windows
                   else None)
        kernels = self._kernels if batches is None else None  # None also off the CPU
        if kernels is not None:
            hidden = self._fused_layers(kernels, hidden, positions, batch, kv)
        else:
            for index, layer in enumerate(self._layers):
                normed = rms_norm(hidden, layer.input_norm, spec.norm_eps)
                qkv = layer.qkv(normed)
                value = qkv[:, q_size + kv_size:].view(-1, spec.num_kv_heads, spec.head_dim)
                if layer.q_norm is not None and layer.k_norm is not None:
                    query = rms_norm(qkv[:, :q_size].view(-1, spec.num_heads, spec.head_dim),
                                     layer.q_norm, spec.norm_eps)
                    key = rms_norm(qkv[:, q_size:q_size + kv_size].view(
                        -1, spec.num_kv_heads, spec.head_dim), layer.k_norm, spec.norm_eps)
                    query, key = self._rotary.apply(query, key, cos_sin)
                else:  # queries and keys side by side: one rotation for both
                    rotated = self._rotary.rotate(
                        qkv[:, :q_size + kv_size].view(-1, heads, spec.head_dim), cos_sin)
                    query, key = rotated[:, :spec.num_heads], rotated[:, spec.num_heads:]
                attended = paged_attention(query, key, value, kv.layer(index),
                                           batch if batches is None else batches[index],
                                           spec.attention_scale, index)
                # residual sums in place: ``hidden`` is this forward's own tensor (bitwise the
                # same)
                hidden = hidden.add_(layer.out(attended.reshape(-1, q_size)))
                normed = rms_norm(hidden, layer.post_norm, spec.norm_eps)
                gate, up = layer.gate_up(normed).chunk(2, dim=-1)
                hidden = hidden.add_(layer.down(self._act(gate).mul_(up)))
        if kernels is not None:
            selected = kernels.rms_norm(hidden[logits_rows], self._final_norm, spec.norm_eps)
        else:
            selected = rms_norm(hidden[logits_rows], self._final_norm, spec.norm_eps)
        return self._lm_head(selected).float()

    def _compiled_step(self, token_ids: torch.Tensor, positions: torch.Tensor,
                       batch: AttentionBatch, kv: KvCachePool,
                       logits_rows: torch.Tensor) -> torch.Tensor:
        """An iteration of decode rows with kept slots and context spans (no extend span) in
        one call of the compiled kernels; the kept slots are grown and filled first, each
        layer's, as ``paged_attention`` would."""
        kernels, shape, plan = self._kernels, self._decode_shape, batch.decode_plan
        assert kernels is not None and shape is not None
        hidden = F.embedding(token_ids, self._embed)
        rows = []
        decode: KeptRows | None = None
        for index, weights in enumerate(self._weight_ptrs):
            layer_cache = kv.layer(index)
            kept = (0, 0)
            if plan is not None:
                keys_t, values = kept_slots(layer_cache, batch, index)
                kept = (keys_t.data_ptr(), values.data_ptr())
                if decode is None:
                    decode = KeptRows(batch.decode_rows, plan.slots, plan.positions,
                                      keys_t.shape[0], values.shape[2])
            rows.append([*weights, *kept, layer_cache.data_ptr()])
        spans = torch.tensor(batch.prefill_spans, dtype=torch.int64).reshape(-1, 2)
        lm_head = self._lm_head
        return kernels.llama_step(
            shape, torch.tensor(rows, dtype=torch.int64), hidden, positions,
            (self._rotary.cos, self._rotary.signed_sin), batch.slot_mapping,
            kv.layer(0).shape[1], decode, spans, logits_rows, self._final_norm, lm_head.weight,
            not lm_head.transposed)

    def _fused_layers(self, kernels: CpuKernels, hidden: torch.Tensor, positions: torch.Tensor,
                      batch: AttentionBatch, kv: KvCachePool) -> torch.Tensor:
        """The layers with the compiled kernels between the matrix products (float32 on the
        CPU, no sliding window): RMSNorm, rotary embeddings in place in the qkv product, the
        attention (paged_attention hands decode rows to the kernel), and each residual sum
        fused with the next RMSNorm. Returns the hidden state after the last layer (the same
        as the op-by-op loop's to float32 rounding)."""
        spec = self.spec
        q_size = spec.num_heads * spec.head_dim
        kv_size = spec.num_kv_heads * spec.head_dim
        heads = spec.num_heads + spec.num_kv_heads
        eps = spec.norm_eps
        normed = kernels.rms_norm(hidden, self._layers[0].input_norm, eps)
        for index, layer in enumerate(self._layers):
            qkv = layer.qkv(normed)
            if layer.q_norm is not None and layer.k_norm is not None:  # Qwen3: per-head norms
                for first, count, weight in ((0, spec.num_heads, layer.q_norm),
                                             (q_size, spec.num_kv_heads, layer.k_norm)):
                    part = qkv[:, first:first + count * spec.head_dim]
                    qkv[:, first:first + count * spec.head_dim] = kernels.rms_norm(
                        part.reshape(-1, spec.head_dim), weight, eps).view(part.shape)
            kernels.rotary_(qkv, heads, spec.head_dim, positions, self._rotary.cos,
                            self._rotary.signed_sin)
            query = qkv[:, :q_size].view(-1, spec.num_heads, spec.head_dim)
            key = qkv[:, q_size:q_size + kv_size].view(-1, spec.num_kv_heads, spec.head_dim)
            value = qkv[:, q_size + kv_size:].view(-1, spec.num_kv_heads, spec.head_dim)
            attended = paged_attention(query, key, value, kv.layer(index), batch,
                                       spec.attention_scale, index)
            normed = kernels.add_rms_norm(hidden, layer.out(attended.reshape(-1, q_size)),
                                          layer.post_norm, eps)
            gate_up = layer.gate_up(normed)
            if self._swiglu:
                activated = kernels.silu_mul(gate_up)
            else:
                gate, up = gate_up.chunk(2, dim=-1)
                activated = self._act(gate).mul_(up)
            delta = layer.down(activated)
            if index + 1 < len(self._layers):
                normed = kernels.add_rms_norm(hidden, delta, self._layers[index + 1].input_norm,
                                              eps)
            else:
                hidden.add_(delta)
        return hidden
