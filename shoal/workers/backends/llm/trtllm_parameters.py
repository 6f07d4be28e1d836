"""TensorRT-LLM's ``tensorrt_llm`` model parameters on the ``llm`` backend, so the stock
``inflight_batcher_llm/tensorrt_llm/config.pbtxt`` (with ``backend: "llm"``) loads unchanged.

Each parameter TensorRT-LLM's backend reads is one of:

- **honoured** (same name, same meaning; read by ``settings.py``, ``guided.py``):
  ``max_beam_width``, ``gpt_model_type``, ``max_tokens_in_paged_kv_cache``,
  ``batch_scheduler_policy``, ``exclude_input_in_output``, ``enable_kv_cache_reuse``,
  ``enable_chunked_context``, ``iter_stats_max_iterations``, ``request_stats_max_iterations``,
  ``guided_decoding_backend``, ``max_num_sequences`` (older releases),
  ``kv_cache_free_gpu_mem_fraction`` on a KIND_GPU instance, ``normalize_log_probs`` when true
  (shoal's log probs are always normalized);
- **mapped**: ``gpt_model_path`` (TensorRT-LLM's engine directory) names the model's Hugging Face
  checkpoint directory, as ``checkpoint_dir`` does;
- **ignored** (``IGNORED``): what has no meaning for this executor (GPU placement, TensorRT
  kernel switches, LoRA, speculative decoding, encoder-decoder models, host KV offload, the
  orchestrator's worker, polling periods), plus ``kv_cache_free_gpu_mem_fraction`` on a CPU
  instance and ``normalize_log_probs`` false. They are accepted, never refused; the backend
  logs ONE warning per instance naming them all.

fill_template.py leaves a placeholder it was not given a value for as ``${name}``; TensorRT-LLM
then fails to parse the value and uses its default, so a value that is exactly one ``${...}``
placeholder is treated as not set (whatever the parameter), and the warning does not name it.
Other parameter names, neither TensorRT-LLM's nor shoal's, are still refused by ``settings.py``.

Pure (no torch): the broker's device-memory estimate (``backends/llm/device_need.py``) reads
the parameters through ``normalize_parameters`` too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from shoal.errors import invalid_arg

CHECKPOINT_PARAMETER: Final = "checkpoint_dir"
ENGINE_PATH_PARAMETER: Final = "gpt_model_path"  # TensorRT-LLM's name, mapped to the above
GPU_FRACTION_PARAMETER: Final = "kv_cache_free_gpu_mem_fraction"
NORMALIZE_LOG_PROBS: Final = "normalize_log_probs"

# fill_template.py's mark of a value it was not given
_PLACEHOLDER: Final = re.compile(r"^\s*\$\{[^{}]*\}\s*$")

# TensorRT-LLM parameters (the stock config.pbtxt of its releases) that change nothing here.
IGNORED: Final = frozenset({
    # placement and inputs: instance_group places shoal's instances; inputs are host memory
    "gpu_device_ids", "participant_ids", "num_nodes", "FORCE_CPU_ONLY_INPUT_TENSORS",
    "executor_worker_path", "worker_path", "recv_poll_period_ms",
    # engine and TensorRT kernel switches
    "gpu_weights_percent", "enable_context_fmha_fp32_acc", "multi_block_mode",
    "cuda_graph_mode", "cuda_graph_cache_size", "enable_trt_overlap",
    "use_context_fmha_for_generation",
    # attention window and KV offload (the checkpoint's own sliding window still applies)
    "max_attention_window_size", "max_kv_cache_length", "sink_token_length",
    "kv_cache_host_memory_bytes", "kv_cache_onboard_blocks",
    # encoder-decoder models
    "encoder_model_path", "cross_kv_cache_fraction",
    # LoRA
    "lora_cache_optimal_adapter_size", "lora_cache_max_adapter_size",
    "lora_cache_gpu_memory_fraction", "lora_cache_host_memory_bytes", "lora_prefetch_dir",
    # decoding modes and speculative decoding (shoal decodes by each request's sampling)
    "decoding_mode", "medusa_choices", "eagle_choices", "speculative_decoding_fast_logits",
    "lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size",
    # guided decoding's tokenizer: shoal uses the checkpoint's tokenizer.json
    "tokenizer_dir", "xgrammar_tokenizer_info_path",
    # periods: shoal checks cancellations every iteration and sends figures every heartbeat
    "cancellation_check_period_ms", "stats_check_period_ms",
})


@dataclass(frozen=True)
class LlmParameters:
    """The model's parameters as the llm backend reads them (placeholders and ignored
    parameters dropped, ``gpt_model_path`` given as ``checkpoint_dir``), what was ignored (to
    warn about) and what was left a placeholder (treated as not set)."""

    values: dict[str, str]
    ignored: tuple[str, ...]
    unset: tuple[str, ...]


def is_placeholder(value: str) -> bool:
    """Whether ``value`` is an unfilled fill_template.py placeholder (``${name}``)."""
    return bool(_PLACEHOLDER.match(value))


def normalize_parameters(raw: Mapping[str, str], *, accelerator: bool) -> LlmParameters:
    """``raw`` (parameter -> string value) as the llm backend reads it; ``accelerator``: the
    instance is on a GPU (``kv_cache_free_gpu_mem_fraction`` is honoured only there). Raises
    INVALID_ARG when ``checkpoint_dir`` and ``gpt_model_path`` name different directories."""
    unset = tuple(sorted(k for k, v in raw.items() if is_placeholder(v)))
    values = {k: v for k, v in raw.items() if k not in unset}
    ignored = {k for k in values if k in IGNORED}
    if not accelerator and GPU_FRACTION_PARAMETER in values:
        ignored.add(GPU_FRACTION_PARAMETER)
    if NORMALIZE_LOG_PROBS in values:
        if values[NORMALIZE_LOG_PROBS].strip().lower() not in ("", "true", "1", "yes"):
            ignored.add(NORMALIZE_LOG_PROBS)
        values.pop(NORMALIZE_LOG_PROBS)  # honoured (or ignored): nothing else reads it
    for name in ignored:
        values.pop(name, None)
    engine = values.pop(ENGINE_PATH_PARAMETER, "").strip()
    if engine:
        given = values.get(CHECKPOINT_PARAMETER, "").strip()
        if given and given != engine:
            raise invalid_arg(f"llm backend: {CHECKPOINT_PARAMETER} '{given}' and "
                              f"{ENGINE_PATH_PARAMETER} '{engine}' name different checkpoints; "
                              "give one")
        values[CHECKPOINT_PARAMETER] = engine
    return LlmParameters(values, tuple(sorted(ignored)), unset)


def ignored_warning(model: str, ignored: tuple[str, ...]) -> str:
    """The one warning naming the parameters the llm backend accepted and ignored."""
    return (f"model '{model}': llm backend: ignoring {len(ignored)} TensorRT-LLM parameter(s) "
            f"that have no effect on this executor: {', '.join(ignored)}")
