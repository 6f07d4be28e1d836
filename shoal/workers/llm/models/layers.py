"""Building blocks shared by the model implementations, written to match Hugging Face's
arithmetic operation for operation (float32 token-for-token equality is the test oracle)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from shoal.errors import unsupported


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm: normalize in float32, scale in the input dtype."""
    dtype = hidden.dtype
    as_float = hidden.to(torch.float32)
    variance = as_float.pow(2).mean(-1, keepdim=True)
    as_float = as_float * torch.rsqrt(variance + eps)
    return weight * as_float.to(dtype)


def gelu_new(hidden: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh approximation of GELU (HF ``NewGELUActivation``)."""
    return 0.5 * hidden * (1.0 + torch.tanh(
        math.sqrt(2.0 / math.pi) * (hidden + 0.044715 * torch.pow(hidden, 3.0))))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": gelu_new,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise unsupported(f"config.json activation {name!r} is not supported "
                          f"(supported: {', '.join(sorted(ACTIVATIONS))})") from None


def take(weights: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    try:
        return weights.pop(name)
    except KeyError:
        raise unsupported(f"checkpoint lacks tensor {name!r}") from None
