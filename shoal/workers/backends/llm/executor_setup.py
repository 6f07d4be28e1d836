"""An ``llm`` model instance's executor, from its config (docs/architecture.md §7, the llm
backend).

``create_executor`` reads the model's parameters: ``trtllm_parameters.normalize_parameters``
first (TensorRT-LLM's parameters that change nothing here are dropped and named in ONE warning
per instance; unfilled ``${...}`` placeholders are unset, and named in one info line;
``gpt_model_path`` is the checkpoint), then ``settings.read_settings`` and the other readers:
the executor's threads (``threads.py``), guided decoding (``guided.py``), logits
post-processors (``logits.py``). ``dynamic_batching.default_queue_policy.max_queue_size``
(> 0) bounds the executor's queue of requests waiting to be admitted
(``ExecutorConfig.max_queue_size``). It returns the started ``shoal.llm.Executor`` and the
settings read. A bad parameter raises INVALID_ARG naming it.
"""

from __future__ import annotations

import dataclasses
import logging

from shoal.llm import Executor
from shoal.llm.checkpoint import read_model_spec
from shoal.workers.backends.base import InstanceContext
from shoal.workers.backends.llm.guided import guided_decoding_config
from shoal.workers.backends.llm.logits import load_logits_post_processors
from shoal.workers.backends.llm.settings import LlmModelSettings, model_parameters, read_settings
from shoal.workers.backends.llm.threads import configure_threads
from shoal.workers.backends.llm.trtllm_parameters import ignored_warning, normalize_parameters

logger = logging.getLogger(__name__)


def create_executor(ctx: InstanceContext) -> tuple[Executor, LlmModelSettings]:
    config = ctx.config
    parameters = normalize_parameters(model_parameters(config),
                                      accelerator=ctx.device.startswith("cuda"))
    if parameters.ignored:
        logger.warning("%s", ignored_warning(ctx.model_name, parameters.ignored))
    if parameters.unset:
        logger.info("model '%s': llm backend: parameter(s) left as ${...} placeholders are "
                    "not set: %s", ctx.model_name, ", ".join(parameters.unset))
    values = parameters.values
    settings = read_settings(values, ctx.model_dir, ctx.device, ctx.backend_settings)
    configure_threads(values, ctx.backend_settings, config, ctx.device,
                      ctx.default_intra_op_threads)
    guided = guided_decoding_config(values, settings.checkpoint_dir,
                                    read_model_spec(settings.checkpoint_dir).eos_token_id)
    processors = load_logits_post_processors(values, ctx.model_dir)
    queue_limit = (int(config.dynamic_batching.default_queue_policy.max_queue_size)
                   if config.HasField("dynamic_batching") else 0)
    executor = Executor(settings.checkpoint_dir, dataclasses.replace(
        settings.executor_config, guided_decoding_config=guided,
        logits_post_processor_config=processors, max_queue_size=queue_limit))
    return executor, settings
