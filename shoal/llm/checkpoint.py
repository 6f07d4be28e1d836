"""Hugging Face checkpoints on disk: ``config.json`` -> ``ModelSpec``, ``*.safetensors`` ->
tensors, ``tokenizer.json`` -> ``tokenizers.Tokenizer``. Nothing is downloaded.

Supported architectures: the Llama family — ``model_type`` "llama", "mistral", "qwen2" and
"qwen3", which differ only by the switches of ``ModelSpec`` (q/k/v and output biases, QK-norm) —
with default or Llama 3 (``rope_type: llama3``) rotary embeddings, and GPT-2. Sliding-window
attention (Mistral's ``sliding_window``; Qwen2/Qwen3's with ``use_sliding_window``, on the layers
``layer_types`` / ``max_window_layers`` make "sliding_attention") is read into
``ModelSpec.layer_windows`` and applied by ``window.py`` as Hugging Face does: a query at
position p attends to the keys of positions (p - window, p]. Anything else fails with
UNSUPPORTED naming the config field at fault.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal.errors import invalid_arg, unsupported

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

logger = logging.getLogger(__name__)

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
ROPE_TYPES = ("default", "llama3")
DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Llama3RopeScaling:
    """``rope_type: llama3`` (Llama 3.1+): inverse frequencies whose wavelength exceeds
    ``original_max_position_embeddings / low_freq_factor`` are divided by ``factor``, those
    below ``original_max_position_embeddings / high_freq_factor`` are kept, and those in between
    are interpolated smoothly (HF ``_compute_llama3_parameters``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelSpec:
    architecture: str  # config.json's model_type; every one but "gpt2" runs on LlamaModel
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    norm_eps: float
    hidden_act: str
    checkpoint_dtype: str
    rope_theta: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None  # None: default rotary embeddings
    qkv_bias: bool = False  # q/k/v projections have biases (Llama attention_bias, Qwen2)
    out_proj_bias: bool = False  # o_proj has a bias (Llama / Qwen3 attention_bias; not Qwen2)
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on each q and k head, before rope
    tie_word_embeddings: bool = False
    attention_scale: float = 1.0  # GPT-2 without layer-index scaling; Llama: head_dim ** -0.5
    scale_attn_by_inverse_layer_idx: bool = False
    eos_token_id: int | None = None
    # the attention window of each layer (None: the layer attends to every earlier position);
    # empty when no layer has one. A query at position p sees positions (p - window, p].
    layer_windows: tuple[int | None, ...] = ()


def read_model_spec(model_dir: str | Path) -> ModelSpec:
    path = Path(model_dir) / "config.json"
    try:
        config: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise invalid_arg("model directory has no config.json") from None
    except (OSError, ValueError) as exc:
        raise invalid_arg(f"config.json cannot be read: {exc}") from None
    model_type = config.get("model_type")
    try:
        if model_type in LLAMA_FAMILY:
            return _llama_spec(config, str(model_type))
        if model_type == "gpt2":
            return _gpt2_spec(config)
    except KeyError as exc:
        raise invalid_arg(f"config.json lacks {exc.args[0]!r}") from None
    raise unsupported(f"config.json model_type {model_type!r} is not supported "
                      f"(supported: {', '.join((*LLAMA_FAMILY, 'gpt2'))})")


def _checkpoint_dtype(config: dict[str, Any]) -> str:
    dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    return str(dtype) if dtype in DTYPES else "float32"


def _eos(config: dict[str, Any]) -> int | None:
    eos = config.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos if isinstance(eos, int) else None


def _rope_scaling(rope: dict[str, Any]) -> Llama3RopeScaling | None:
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise unsupported(f"config.json rope_type {rope_type!r} is not supported "
                          f"(supported: {', '.join(ROPE_TYPES)})")
    if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
        raise unsupported("config.json partial_rotary_factor is not supported (rotary "
                          "embeddings on the whole head only)")
    if rope_type == "default":
        return None
    scaling = Llama3RopeScaling(
        factor=float(rope["factor"]), low_freq_factor=float(rope["low_freq_factor"]),
        high_freq_factor=float(rope["high_freq_factor"]),
        original_max_position_embeddings=int(rope["original_max_position_embeddings"]))
    if scaling.high_freq_factor <= scaling.low_freq_factor:
        raise invalid_arg("config.json rope_scaling high_freq_factor must be greater than "
                          "low_freq_factor")
    return scaling


def _layer_windows(config: dict[str, Any], model_type: str) -> tuple[int | None, ...]:
    """The attention window of each layer, as HF applies it, or () when no layer has one.
    Mistral applies its ``sliding_window`` to every layer; Qwen2/Qwen3 only with
    ``use_sliding_window`` and only to layers typed "sliding_attention" by ``layer_types`` (by
    default those from ``max_window_layers`` on); Llama never."""
    window = config.get("sliding_window")
    if window is None or model_type == "llama":
        return ()
    window = int(window)
    if window < 1:
        raise invalid_arg(f"config.json sliding_window must be positive, got {window}")
    num_layers = int(config["num_hidden_layers"])
    if model_type == "mistral":
        return (window,) * num_layers
    if not config.get("use_sliding_window", False):
        return ()
    layer_types = config.get("layer_types")
    if layer_types is None:
        first_sliding = int(config.get("max_window_layers", 28))  # HF's default
        layer_types = ["sliding_attention" if i >= first_sliding else "full_attention"
                       for i in range(num_layers)]
    if len(layer_types) != num_layers:
        raise invalid_arg(f"config.json layer_types has {len(layer_types)} entries for "
                          f"{num_layers} layers")
    windows = tuple(window if kind == "sliding_attention" else None for kind in layer_types)
    return windows if any(w is not None for w in windows) else ()


def _llama_spec(config: dict[str, Any], model_type: str) -> ModelSpec:
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_scaling = _rope_scaling(rope)
    max_positions = int(config["max_position_embeddings"])
    biased = bool(config.get("attention_bias", False))
    if model_type == "qwen2":  # biases on q/k/v only, whatever attention_bias says
        qkv_bias, out_proj_bias = True, False
    elif model_type == "mistral":  # no biases anywhere
        qkv_bias = out_proj_bias = False
    else:
        qkv_bias = out_proj_bias = biased
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    return ModelSpec(
        architecture=model_type,
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        num_layers=int(config["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        intermediate_size=int(config["intermediate_size"]),
        max_position_embeddings=max_positions,
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        hidden_act=str(config.get("hidden_act", "silu")),
        checkpoint_dtype=_checkpoint_dtype(config),
        rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        rope_scaling=rope_scaling,
        qkv_bias=qkv_bias,
        out_proj_bias=out_proj_bias,
        mlp_bias=model_type == "llama" and bool(config.get("mlp_bias", False)),
        qk_norm=model_type == "qwen3",
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_scale=head_dim ** -0.5,
        eos_token_id=_eos(config),
        layer_windows=_layer_windows(config, model_type),
    )


def _gpt2_spec(config: dict[str, Any]) -> ModelSpec:
    hidden = int(config["n_embd"])
    heads = int(config["n_head"])
    head_dim = hidden // heads
    scale = head_dim ** -0.5 if config.get("scale_attn_weights", True) else 1.0
    return ModelSpec(
        architecture="gpt2",
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        num_layers=int(config["n_layer"]),
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=head_dim,
        intermediate_size=int(config.get("n_inner") or 4 * hidden),
        max_position_embeddings=int(config["n_positions"]),
        norm_eps=float(config.get("layer_norm_epsilon", 1e-5)),
        hidden_act=str(config.get("activation_function", "gelu_new")),
        checkpoint_dtype=_checkpoint_dtype(config),
        tie_word_embeddings=True,
        attention_scale=scale,
        scale_attn_by_inverse_layer_idx=bool(config.get("scale_attn_by_inverse_layer_idx",
                                                        False)),
        eos_token_id=_eos(config),
    )


def load_weights(model_dir: str | Path, device: str,
                 dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor of every ``*.safetensors`` file of the directory, cast to ``dtype`` and
    moved to ``device``."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise invalid_arg("model directory has no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            tensors = load_file(str(file), device="cpu")
        except Exception as exc:  # safetensors raises its own error types
            raise invalid_arg(f"weights file {file.name} cannot be read: {exc}") from None
        for name, tensor in tensors.items():
            weights[name] = tensor.to(dtype=dtype).to(device)
    logger.info("loaded %d tensors from %d safetensors file(s)", len(weights), len(files))
    return weights


def load_tokenizer(model_dir: str | Path) -> Tokenizer | None:
    """The directory's ``tokenizer.json``, or None when it has none (the executor works on
    token ids; the tokenizer is for callers that start from text)."""
    from tokenizers import Tokenizer

    path = Path(model_dir) / "tokenizer.json"
    if not path.exists():
        return None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on malformed files
        raise invalid_arg(f"tokenizer.json cannot be read: {exc}") from None
