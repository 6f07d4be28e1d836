"""Building blocks shared by the model implementations, written to match Hugging Face's
arithmetic operation for operation (float32 token-for-token equality is the test oracle)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from shoal.errors import unsupported


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm: normalize in float32, scale in the input dtype. The same operations as
    Hugging Face's, less the casts that are no-ops in float32 and with the temporaries updated
    in place (a decoding step calls this 2 * layers + 1 times on small tensors, where each
    dispatched op costs more than its arithmetic)."""
    dtype = hidden.dtype
    as_float = hidden if dtype == torch.float32 else hidden.to(torch.float32)
    variance = as_float.pow(2).mean(-1, keepdim=True)
    normed = as_float * variance.add_(eps).rsqrt_()
    return weight * (normed if dtype == torch.float32 else normed.to(dtype))


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


class Linear:
    """``F.linear(x, weight, bias)`` for a 2-D ``x`` (the packed tokens), with the weight kept
    transposed ([in, out], contiguous) on the CPU: MKL's sgemm runs the few rows of a decoding
    step 20-60% faster on that layout than on the [out, in] one (32 rows of the 4-layer
    benchmark model), and the product is bitwise the same, so logits stay equal to Hugging
    Face's. Elsewhere (CUDA, NPU) the weight keeps its checkpoint layout and ``F.linear``.
    ``share``: the weight is also used as is elsewhere (a tied embedding), so no transposed
    copy is made."""

    __slots__ = ("_bias", "_transposed", "_weight")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 share: bool = False) -> None:
        self._transposed = weight.device.type == "cpu" and not share
        self._weight = weight.t().contiguous() if self._transposed else weight
        self._bias = bias

    @property
    def weight(self) -> torch.Tensor:
        """The weight as kept: [in, out] when ``transposed``, else the checkpoint's [out, in]."""
        return self._weight

    @property
    def transposed(self) -> bool:
        return self._transposed

    @property
    def bias(self) -> torch.Tensor | None:
        return self._bias

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        if not self._transposed:
            return F.linear(hidden, self._weight, self._bias)
        if self._bias is None:
            return torch.mm(hidden, self._weight)
        return torch.addmm(self._bias, hidden, self._weight)


def take(weights: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    try:
        return weights.pop(name)
    except KeyError:
        raise unsupported(f"checkpoint lacks tensor {name!r}") from None
