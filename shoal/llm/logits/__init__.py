"""Logits post-processors (TensorRT-LLM's ``LogitsPostProcessorConfig``) and the top log-prob
alternatives of ``OutputConfig.num_top_log_probs``: what happens to an iteration's logits between
the model and the token choice, besides the sampling parameters of ``sampling.py``."""

from __future__ import annotations

from shoal.llm.logits.config import (
    BATCHED_POST_PROCESSOR_NAME,
    LogitsPostProcessor,
    LogitsPostProcessorBatched,
    LogitsPostProcessorConfig,
)

__all__ = [
    "BATCHED_POST_PROCESSOR_NAME",
    "LogitsPostProcessor",
    "LogitsPostProcessorBatched",
    "LogitsPostProcessorConfig",
]
