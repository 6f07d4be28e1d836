"""What one instance of an ``llm``-backend model takes on its device, for the device-memory
ledger: the checkpoint's weights and the executor's KV pool.

The broker never imports torch (nor ``shoal.llm``, whose package imports it), so this
reads the checkpoint's ``config.json`` and file sizes itself, with the executor's own rules
(``llm/checkpoint.read_model_spec``, ``executor._num_blocks``, ``KvCachePool``; the
fraction rule is the backend's own, ``workers/backends/llm/kv_pool``; a unit test holds the two
to the same bytes):

    KV pool = layers x 2 (key, value) x blocks x tokens_per_block x kv_heads x head_dim x element
    blocks  = kv_cache_num_blocks, or max_tokens_in_paged_kv_cache / tokens_per_block (rounded
              up), or max_num_sequences x max_beam_width x max_seq_len / tokens_per_block
    weights = the checkpoint's *.safetensors sizes, scaled from the checkpoint's dtype to the
              load dtype (the ``dtype`` parameter, else the checkpoint's: a GPU instance loads
              in the checkpoint's dtype)

``kv_cache_free_gpu_mem_fraction`` sizes the pool from the device's free memory when the worker
loads; here it is that fraction of what the device's limit leaves free after the weights (the
caller passes ``free_bytes``). Anything unreadable gives None: the ledger then falls back to its
general rule (the version directory's files).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from shoal.errors import ShoalError
from shoal.workers.backends.llm.kv_pool import blocks_for_tokens, fraction_blocks
from shoal.workers.backends.llm.trtllm_parameters import normalize_parameters

_ELEMENT_BYTES: Final = {"float32": 4, "float16": 2, "bfloat16": 2}
_DEFAULTS: Final = {"max_num_sequences": 64, "max_beam_width": 1,
                    "kv_cache_tokens_per_block": 32}


def _int(parameters: Mapping[str, str], name: str) -> int | None:
    text = parameters.get(name, "").strip()
    return int(text) if text else None


def _dtype(config: Mapping[str, Any]) -> str:
    dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    return str(dtype) if dtype in _ELEMENT_BYTES else "float32"


def _shape(config: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(layers, kv heads, head dim, max positions) as the executor reads them."""
    if config.get("model_type") == "gpt2":
        heads = int(config["n_head"])
        return (int(config["n_layer"]), heads, int(config["n_embd"]) // heads,
                int(config["n_positions"]))
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    return (int(config["num_hidden_layers"]), int(config.get("num_key_value_heads") or heads),
            head_dim, int(config["max_position_embeddings"]))


def llm_instance_bytes(parameters: Mapping[str, str], model_dir: str,
                       free_bytes: int | None = None) -> dict[str, int] | None:
    """``{"weights": bytes, "kv_pool": bytes}`` of one GPU instance of an llm-backend model
    whose config parameters are ``parameters`` (strings) in ``model_dir``; None when the
    checkpoint cannot be read. ``free_bytes``: the device's free share, for
    ``kv_cache_free_gpu_mem_fraction`` (unknown: the pool counts 0). The parameters are read
    as the backend reads them (``normalize_parameters``: TensorRT-LLM's names and ``${...}``
    placeholders)."""
    try:
        parameters = normalize_parameters(parameters, accelerator=True).values
    except ShoalError:
        return None
    checkpoint = Path(os.path.join(model_dir, parameters.get("checkpoint_dir", "").strip()))
    try:
        config = json.loads((checkpoint / "config.json").read_text())
        layers, kv_heads, head_dim, max_positions = _shape(config)
        stored = _ELEMENT_BYTES[_dtype(config)]
        requested = parameters.get("dtype", "").strip()
        element = _ELEMENT_BYTES.get(requested, stored) if requested else stored
        files = sum(f.stat().st_size for f in checkpoint.glob("*.safetensors"))
        tokens_per_block = _int(parameters, "kv_cache_tokens_per_block") \
            or _DEFAULTS["kv_cache_tokens_per_block"]
        num_blocks = _int(parameters, "kv_cache_num_blocks")
        max_tokens = _int(parameters, "max_tokens_in_paged_kv_cache")
        fraction_text = parameters.get("kv_cache_free_gpu_mem_fraction", "").strip()
        max_seq_len = min(_int(parameters, "max_seq_len") or max_positions, max_positions)
        sequences = (_int(parameters, "max_num_sequences") or _DEFAULTS["max_num_sequences"]) \
            * (_int(parameters, "max_beam_width") or _DEFAULTS["max_beam_width"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    weights = files * element // stored
    per_block = layers * 2 * tokens_per_block * kv_heads * head_dim * element
    if num_blocks is None and fraction_text:
        try:
            fraction = float(fraction_text)
        except ValueError:
            return None
        num_blocks = fraction_blocks(fraction, free_bytes or 0, weights, per_block, max_tokens,
                                     tokens_per_block)
    elif num_blocks is None:
        tokens = max_tokens if max_tokens is not None else sequences * max_seq_len
        num_blocks = blocks_for_tokens(tokens, tokens_per_block)
    return {"weights": weights, "kv_pool": num_blocks * per_block}
