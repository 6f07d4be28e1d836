"""Rotary position embeddings: the inverse frequencies of each ``rope_type`` and the cos/sin
table of every position, computed with Hugging Face's float32 arithmetic operation for
operation (``modeling_rope_utils``), so logits stay bitwise equal to HF's."""

from __future__ import annotations

import math

import torch

from shoal.workers.llm.checkpoint import Llama3RopeScaling


def default_inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """inv_freq[i] = 1 / theta ** (2i / head_dim), float32 [head_dim / 2]."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta ** exponents)


def llama3_inverse_frequencies(head_dim: int, theta: float,
                               scaling: Llama3RopeScaling) -> torch.Tensor:
    """HF ``_compute_llama3_parameters``: long wavelengths slowed by ``factor``, short ones
    kept, the band between interpolated. Its attention factor is 1 (cos/sin unscaled)."""
    inv_freq = default_inverse_frequencies(head_dim, theta)
    factor = scaling.factor
    old_context_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context_len / scaling.low_freq_factor
    high_freq_wavelen = old_context_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = ((old_context_len / wavelen - scaling.low_freq_factor)
                     / (scaling.high_freq_factor - scaling.low_freq_factor))
    smoothed = (1 - smooth_factor) * scaled / factor + smooth_factor * scaled
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed, scaled)


def inverse_frequencies(head_dim: int, theta: float,
                        scaling: Llama3RopeScaling | None) -> torch.Tensor:
    if scaling is None:
        return default_inverse_frequencies(head_dim, theta)
    return llama3_inverse_frequencies(head_dim, theta, scaling)


class RotaryTable:
    """cos/sin of every position below ``max_positions`` for rotate-half rotary embeddings with
    the inverse frequencies ``inv_freq`` (float32 [head_dim / 2])."""

    def __init__(self, inv_freq: torch.Tensor, max_positions: int, dtype: torch.dtype,
                 device: str) -> None:
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        self.cos = angles.cos().to(dtype=dtype, device=device)
        self.sin = angles.sin().to(dtype=dtype, device=device)

    def at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of ``positions`` [T], shaped [T, 1, D] for ``apply``."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]

    @staticmethod
    def apply(query: torch.Tensor, key: torch.Tensor,
              cos_sin: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """query [T, H, D], key [T, Hkv, D]; ``cos_sin`` from ``at``."""
        cos, sin = cos_sin
        return (query * cos) + (_rotate_half(query) * sin), (key * cos) + (_rotate_half(key) * sin)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
