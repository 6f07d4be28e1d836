"""The ``llm`` backend's model settings: ``config.pbtxt`` parameters -> checkpoint directory and
``ExecutorConfig``. Names follow TensorRT-LLM's backend where it has one.

=============================== ===================================================== =========
parameter                       meaning                                               default
=============================== ===================================================== =========
``checkpoint_dir``              Hugging Face checkpoint directory, relative to the    required
                                model's folder or absolute (TensorRT-LLM's
                                ``gpt_model_path`` names it too)
``max_num_sequences``           requests in one iteration (executor max batch size)   64
``max_num_tokens``              tokens computed in one iteration                      8192
``max_seq_len``                 prompt + generated tokens per sequence                model's
``max_beam_width``              widest beam search a request may ask for             1
``kv_cache_num_blocks``         KV cache pool size in blocks ...                      see below
``max_tokens_in_paged_kv_cache`` ... or in tokens (rounded up to whole blocks) ...
``kv_cache_free_gpu_mem_fraction`` ... or as a fraction of the free device memory
                                (accelerator instances only)
``kv_cache_tokens_per_block``   tokens per KV block                                   32
``batch_scheduler_policy``      ``guaranteed_no_evict`` or ``max_utilization``        g._n._e.
``gpt_model_type``              ``inflight_fused_batching`` / ``inflight_batching``   inflight
                                or ``V1`` (static batching)
``exclude_input_in_output``     non-streaming outputs leave the prompt out            false
``dtype``                       ``float32`` / ``float16`` / ``bfloat16``              see Exec.
``guided_decoding_backend``     ``xgrammar`` or ``none`` (``guided.py``)              xgrammar
``logits_post_processors``      python file of logits post-processors (``logits.py``) none
``INTRA_OP_THREAD_COUNT``       torch threads of the worker (``threads.py``)         cores - 1
``enable_kv_cache_reuse``       reuse KV blocks of identical prompt prefixes          true
``enable_chunked_context``      prefill long prompts over several iterations          false
``iter_stats_max_iterations``   iteration statistics kept between two reads           1000
``request_stats_max_iterations`` request statistics kept (0: off)                     0
=============================== ===================================================== =========

With no pool size the pool holds ``max_num_sequences * max_beam_width`` sequences of
``max_seq_len`` tokens; ``max_tokens_in_paged_kv_cache`` with ``kv_cache_free_gpu_mem_fraction``
takes the smaller of the two, as TensorRT-LLM does. The parameters arrive here through
``trtllm_parameters.normalize_parameters``: TensorRT-LLM's parameters that change nothing here
and unfilled ``${...}`` placeholders are gone, ``gpt_model_path`` is ``checkpoint_dir``.

The checkpoint must resolve (symlinks followed) inside the model's folder unless the server
names other allowed roots: ``--backend-config=llm,checkpoint-roots=/a:/b``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shoal.errors import invalid_arg
from shoal.llm import (
    BatchingType,
    CapacitySchedulerPolicy,
    ExecutorConfig,
    KvCacheConfig,
    SchedulerConfig,
)
from shoal.llm.checkpoint import DTYPES, read_model_spec
from shoal.workers.backends.llm.kv_pool import fraction_blocks

ALLOWED_ROOTS_SETTING = "checkpoint-roots"
_KNOWN = frozenset({
    "checkpoint_dir", "max_num_sequences", "max_num_tokens", "max_seq_len", "max_beam_width",
    "kv_cache_num_blocks", "max_tokens_in_paged_kv_cache", "kv_cache_free_gpu_mem_fraction",
    "kv_cache_tokens_per_block", "batch_scheduler_policy", "gpt_model_type",
    "exclude_input_in_output", "dtype", "enable_kv_cache_reuse", "enable_chunked_context",
    "guided_decoding_backend",  # read by guided.py (xgrammar | none)
    "INTRA_OP_THREAD_COUNT",  # read by threads.py (torch intra-op threads)
    "logits_post_processors",  # read by logits.py (a python file in the model's folder)
    "iter_stats_max_iterations", "request_stats_max_iterations",
})
_POLICIES = {p.value: p for p in CapacitySchedulerPolicy}
_BATCHING = {"inflight_fused_batching": BatchingType.INFLIGHT,
             "inflight_batching": BatchingType.INFLIGHT, "v1": BatchingType.STATIC}


@dataclass(frozen=True)
class LlmModelSettings:
    checkpoint_dir: Path
    executor_config: ExecutorConfig
    exclude_input_in_output: bool


def model_parameters(config: Any) -> dict[str, str]:
    """``config.parameters`` as plain strings (protobuf ``ModelConfig``)."""
    return {key: value.string_value for key, value in config.parameters.items()}


def read_settings(parameters: dict[str, str], model_dir: str, device: str,
                  backend_settings: dict[str, str]) -> LlmModelSettings:
    """``parameters``: ``normalize_parameters``' values. Raises INVALID_ARG naming the
    parameter at fault. Unknown ``shoal_*`` parameters belong to the server and are ignored;
    other unknown ones are refused (a typo would silently fall back to a default)."""
    unknown = sorted(k for k in parameters if k not in _KNOWN and not k.startswith("shoal_"))
    if unknown:
        raise invalid_arg(f"llm backend: unknown config parameter(s) {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(_KNOWN))}; TensorRT-LLM's that change "
                          f"nothing here are accepted and ignored)")
    checkpoint = resolve_checkpoint(parameters.get("checkpoint_dir", ""), model_dir,
                                    backend_settings.get(ALLOWED_ROOTS_SETTING, ""))
    policy_name = parameters.get("batch_scheduler_policy", "guaranteed_no_evict").lower()
    if policy_name not in _POLICIES:
        raise invalid_arg(f"llm backend: batch_scheduler_policy must be one of "
                          f"{', '.join(_POLICIES)}, got '{policy_name}'")
    batching_name = parameters.get("gpt_model_type", "inflight_fused_batching").lower()
    if batching_name not in _BATCHING:
        raise invalid_arg(f"llm backend: gpt_model_type must be inflight_fused_batching, "
                          f"inflight_batching or V1, got '{batching_name}'")
    dtype = parameters.get("dtype") or None
    if dtype is not None and dtype not in DTYPES:
        raise invalid_arg(f"llm backend: dtype must be one of {', '.join(DTYPES)}, got '{dtype}'")
    max_num_sequences = _int(parameters, "max_num_sequences", 64)
    max_beam_width = _int(parameters, "max_beam_width", 1)
    max_seq_len = _optional_int(parameters, "max_seq_len")
    tokens_per_block = _int(parameters, "kv_cache_tokens_per_block", 32)
    num_blocks = _optional_int(parameters, "kv_cache_num_blocks")
    max_tokens = _optional_int(parameters, "max_tokens_in_paged_kv_cache")
    fraction = _optional_fraction(parameters, "kv_cache_free_gpu_mem_fraction")
    if num_blocks is not None:
        also = [n for n, v in (("max_tokens_in_paged_kv_cache", max_tokens),
                               ("kv_cache_free_gpu_mem_fraction", fraction)) if v is not None]
        if also:
            raise invalid_arg("llm backend: give one KV cache size, not "
                              f"{' and '.join(['kv_cache_num_blocks', *also])}")
    if fraction is not None:  # with max_tokens too: the smaller pool (kv_pool)
        num_blocks = _blocks_for_fraction(fraction, max_tokens, checkpoint, device,
                                          tokens_per_block, dtype)
        max_tokens = None
    stats: dict[str, Any] = {}  # only the bounds given (0 allowed): ExecutorConfig's defaults
    for name in ("iter_stats_max_iterations", "request_stats_max_iterations"):
        bound = _optional_int(parameters, name, minimum=0)
        if bound is not None:
            stats[name] = bound
    try:
        executor_config = ExecutorConfig(
            max_beam_width=max_beam_width, max_batch_size=max_num_sequences,
            max_num_tokens=_int(parameters, "max_num_tokens", 8192), max_seq_len=max_seq_len,
            batching_type=_BATCHING[batching_name],
            enable_chunked_context=_bool(parameters, "enable_chunked_context", False),
            scheduler_config=SchedulerConfig(_POLICIES[policy_name]),
            kv_cache_config=KvCacheConfig(tokens_per_block=tokens_per_block,
                                          max_tokens=max_tokens, num_blocks=num_blocks,
                                          enable_block_reuse=_bool(
                                              parameters, "enable_kv_cache_reuse", True)),
            device=device, dtype=dtype, **stats)
    except ValueError as exc:
        raise invalid_arg(f"llm backend: {exc}") from None
    exclude = parameters.get("exclude_input_in_output", "false").strip().lower()
    if exclude not in ("true", "false", "1", "0", "yes", "no"):
        raise invalid_arg(f"llm backend: exclude_input_in_output must be true or false, "
                          f"got '{exclude}'")
    return LlmModelSettings(checkpoint, executor_config, exclude in ("true", "1", "yes"))


def resolve_checkpoint(value: str, model_dir: str, allowed_roots: str) -> Path:
    """``value`` relative to ``model_dir`` (or absolute), symlinks resolved; it must lie inside
    the model's folder or one of ``allowed_roots`` (``os.pathsep``-separated)."""
    if not value.strip():
        raise invalid_arg("llm backend: config parameter checkpoint_dir (or TensorRT-LLM's "
                          "gpt_model_path) is required (the Hugging Face checkpoint directory, "
                          "relative to the model's folder)")
    path = Path(os.path.join(model_dir, value)).resolve()
    roots = [Path(model_dir).resolve()] + [Path(r).resolve()
                                           for r in allowed_roots.split(os.pathsep) if r]
    if not any(path == root or path.is_relative_to(root) for root in roots):
        raise invalid_arg(f"llm backend: checkpoint_dir '{value}' resolves to {path}, outside "
                          f"the model's folder; allow its root with "
                          f"--backend-config=llm,{ALLOWED_ROOTS_SETTING}=<dir>")
    if not path.is_dir():
        raise invalid_arg(f"llm backend: checkpoint_dir '{value}' is not a directory ({path})")
    return path


def _bool(parameters: dict[str, str], name: str, default: bool) -> bool:
    text = parameters.get(name, "").strip().lower()
    if not text:
        return default
    if text not in ("true", "false", "1", "0", "yes", "no"):
        raise invalid_arg(f"llm backend: config parameter {name} must be true or false, "
                          f"got '{text}'")
    return text in ("true", "1", "yes")


def _int(parameters: dict[str, str], name: str, default: int) -> int:
    value = _optional_int(parameters, name)
    return default if value is None else value


def _optional_int(parameters: dict[str, str], name: str, *, minimum: int = 1) -> int | None:
    text = parameters.get(name, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise invalid_arg(f"llm backend: config parameter {name} must be an integer, "
                          f"got '{text}'") from None
    if value < minimum:
        raise invalid_arg(f"llm backend: config parameter {name} must be >= {minimum}, "
                          f"got {value}")
    return value


def _optional_fraction(parameters: dict[str, str], name: str) -> float | None:
    text = parameters.get(name, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value <= 1.0:
        raise invalid_arg(f"llm backend: config parameter {name} must be in (0, 1], "
                          f"got '{text}'")
    return value


def _blocks_for_fraction(fraction: float, max_tokens: int | None, checkpoint: Path, device: str,
                         tokens_per_block: int, dtype: str | None) -> int:
    """Blocks that fit in ``fraction`` of the device's free memory once the weights are loaded
    (their size estimated from the checkpoint's files, scaled to the load dtype), at most those
    of ``max_tokens`` (``kv_pool.fraction_blocks``)."""
    # normalize_parameters drops the fraction on an instance that is not on a CUDA device
    assert device.startswith("cuda"), f"kv_cache_free_gpu_mem_fraction on {device}"
    import torch

    spec = read_model_spec(checkpoint)
    load_dtype = dtype or spec.checkpoint_dtype
    element = torch.empty(0, dtype=getattr(torch, load_dtype)).element_size()
    stored = torch.empty(0, dtype=getattr(torch, spec.checkpoint_dtype)).element_size()
    weights = sum(f.stat().st_size for f in checkpoint.glob("*.safetensors")) * element // stored
    free, _total = torch.cuda.mem_get_info(torch.device(device))
    per_block = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * tokens_per_block * element
    blocks = fraction_blocks(fraction, free, weights, per_block, max_tokens, tokens_per_block)
    if blocks < 1:
        raise invalid_arg(
            f"llm backend: kv_cache_free_gpu_mem_fraction {fraction} leaves no room for a KV "
            f"block ({per_block} bytes) on {device}")
    return blocks
