"""Rotary position embeddings: the inverse frequencies of each ``rope_type`` and the cos/sin
table of every position, computed with Hugging Face's float32 arithmetic operation for
operation (``modeling_rope_utils``), so logits stay bitwise equal to HF's."""

from __future__ import annotations

import math

import torch

from shoal.llm.checkpoint import Llama3RopeScaling


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
    the inverse frequencies ``inv_freq`` (float32 [head_dim / 2]).

    Hugging Face computes ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) =
    cat(-x2, x1)``. Here the sign lives in the table (``signed_sin = cat(-sin1, sin2)``) and
    ``roll`` swaps the halves: ``(-a) * b == a * (-b)`` exactly in IEEE arithmetic, so the result
    is bitwise the same with two dispatched ops fewer per call."""

    def __init__(self, inv_freq: torch.Tensor, max_positions: int, dtype: torch.dtype,
                 device: str) -> None:
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        self.cos = angles.cos().to(dtype=dtype, device=device)
        sin = angles.sin()
        half = sin.shape[-1] // 2
        self.signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1).to(
            dtype=dtype, device=device)

    def at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin of ``positions`` [T], shaped [T, 1, D] for ``rotate``."""
        return self.cos[positions][:, None, :], self.signed_sin[positions][:, None, :]

    @staticmethod
    def rotate(heads: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """``heads`` [T, H, D] (queries and keys may be rotated together, side by side in H);
        ``cos_sin`` from ``at``. Returns a new tensor."""
        cos, signed_sin = cos_sin
        swapped = heads.roll(heads.shape[-1] // 2, dims=-1)
        return (heads * cos).add_(swapped.mul_(signed_sin))

    @classmethod
    def apply(cls, query: torch.Tensor, key: torch.Tensor,
              cos_sin: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """query [T, H, D], key [T, Hkv, D] rotated separately."""
        return cls.rotate(query, cos_sin), cls.rotate(key, cos_sin)
