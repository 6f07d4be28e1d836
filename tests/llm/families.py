"""Tiny random checkpoints of the Llama relatives (Llama 3 rope scaling, Qwen2, Qwen3, Mistral),
built with transformers at a fixed seed in float32: 2 layers, hidden 64, 4 query / 2 key-value
heads, vocabulary 256. Nothing is downloaded."""

from __future__ import annotations

import pathlib
from typing import Any

import torch

VOCAB = 256
INIT_RANGE = 0.5  # as in conftest: wide enough that greedy outputs vary
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
# head_dim 16, theta 1e4: wavelengths 6.3 ... 19,869 span all three llama3 bands
# (< 64 / 4 kept, 16 .. 64 interpolated, > 64 divided by factor)

_COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
    initializer_range=INIT_RANGE, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def build(family: str, path: pathlib.Path, **overrides: Any) -> pathlib.Path:
    """Save a tiny random ``family`` checkpoint ("llama3", "qwen2", "qwen3", "mistral") to
    ``path``; ``overrides`` change its config."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    seeds = {"llama3": 31, "qwen2": 32, "qwen3": 33, "mistral": 34}
    torch.manual_seed(seeds[family])
    kwargs = _COMMON | overrides
    model: Any
    if family == "llama3":
        model = LlamaForCausalLM(LlamaConfig(**({"rope_parameters": LLAMA3_ROPE} | kwargs)))
    elif family == "qwen2":
        # tied like Qwen2.5-0.5B: no lm_head.weight in the file (a tied tiny Qwen3 repeats
        # one token greedily, which would make its oracle test weak)
        model = Qwen2ForCausalLM(Qwen2Config(**({"tie_word_embeddings": True} | kwargs)))
    elif family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**kwargs))
    elif family == "mistral":
        model = MistralForCausalLM(MistralConfig(**({"sliding_window": None} | kwargs)))
    else:
        raise ValueError(family)
    model.save_pretrained(path, safe_serialization=True)
    return path
