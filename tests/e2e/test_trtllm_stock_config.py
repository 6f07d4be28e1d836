"""TensorRT-LLM's stock ``inflight_batcher_llm/tensorrt_llm/config.pbtxt`` on the ``llm``
backend: the template (generated here from a description of its inputs, outputs and parameters,
with the same keys, structure and values; ``${...}`` placeholders included) filled the way
fill_template.py fills it, with ``backend: "llm"`` for ``tensorrtllm``, loads unchanged with its
``dynamic_batching``, its ``model_transaction_policy`` and every parameter. The checkpoint is
named by ``gpt_model_path`` (an absolute path outside the repository, as TensorRT-LLM users give
their engine directory; allowed with ``--backend-config=llm,checkpoint-roots=``).

Three models on one server: the template filled with typical values (decoupled, gRPC streaming),
the same with ``decoupled_mode: False`` (gRPC and HTTP ``infer``, TensorRT-LLM's refusals of
streaming and of batches in that mode) and the template with only what the protobuf text needs
filled (every other parameter left a placeholder: not set). Requests use TensorRT-LLM's tensor
names (``input_ids``, ``input_lengths``, ``request_output_len`` -> ``output_ids``,
``sequence_length``); greedy outputs equal Hugging Face ``generate``. Each model logs exactly one
warning, naming the parameters it ignores; the server logs no other warning."""

from __future__ import annotations

import pathlib
import queue
import re
import string
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer

pytestmark = pytest.mark.e2e

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = ROOT / "examples" / "llm_repository" / "build.py"

# ------------------------------------------------------------------ the stock template

# Inputs of the tensorrt_llm model: (name, data type, dims, flags); flags: "s" a [1] reshaped to
# a scalar per batch item (reshape { shape: [ ] }), "r" allow_ragged_batch, "o" optional.
_SCALAR_OPTIONS = [
    ("beam_width", "TYPE_INT32"), ("temperature", "TYPE_FP32"), ("runtime_top_k", "TYPE_INT32"),
    ("runtime_top_p", "TYPE_FP32"), ("runtime_top_p_min", "TYPE_FP32"),
    ("runtime_top_p_decay", "TYPE_FP32"), ("runtime_top_p_reset_ids", "TYPE_INT32"),
    ("len_penalty", "TYPE_FP32"), ("early_stopping", "TYPE_BOOL"),
    ("repetition_penalty", "TYPE_FP32"), ("min_tokens", "TYPE_INT32"),
    ("beam_search_diversity_rate", "TYPE_FP32"), ("presence_penalty", "TYPE_FP32"),
    ("frequency_penalty", "TYPE_FP32"), ("seed", "TYPE_UINT64"),
    ("return_log_probs", "TYPE_BOOL"), ("return_context_logits", "TYPE_BOOL"),
    ("return_generation_logits", "TYPE_BOOL"), ("return_perf_metrics", "TYPE_BOOL"),
    ("exclude_input_in_output", "TYPE_BOOL"), ("stop", "TYPE_BOOL"), ("streaming", "TYPE_BOOL"),
]
INPUTS: list[tuple[str, str, list[int], str]] = [
    ("input_ids", "TYPE_INT32", [-1], "ro"),
    ("encoder_input_features", "${encoder_input_features_data_type}", [-1, -1], "ro"),
    ("encoder_output_lengths", "TYPE_INT32", [1], "so"),
    ("input_lengths", "TYPE_INT32", [1], "s"),
    ("request_output_len", "TYPE_INT32", [1], "s"),
    ("num_return_sequences", "TYPE_INT32", [1], "so"),
    ("draft_input_ids", "TYPE_INT32", [-1], "or"),
    ("decoder_input_ids", "TYPE_INT32", [-1], "or"),
    ("decoder_input_lengths", "TYPE_INT32", [1], "os"),
    ("draft_logits", "${logits_datatype}", [-1, -1], "or"),
    ("draft_acceptance_threshold", "TYPE_FP32", [1], "so"),
    ("end_id", "TYPE_INT32", [1], "so"),
    ("pad_id", "TYPE_INT32", [1], "so"),
    ("stop_words_list", "TYPE_INT32", [2, -1], "or"),
    ("bad_words_list", "TYPE_INT32", [2, -1], "or"),
    ("embedding_bias", "TYPE_FP32", [-1], "or"),
    *((name, datatype, [1], "so") for name, datatype in _SCALAR_OPTIONS),
    ("prompt_embedding_table", "TYPE_FP16", [-1, -1], "or"),
    ("prompt_table_extra_ids", "TYPE_UINT64", [-1], "or"),
    ("prompt_vocab_size", "TYPE_INT32", [1], "so"),
    ("cross_attention_mask", "TYPE_BOOL", [-1, -1], "or"),
    ("mrope_rotary_cos_sin", "TYPE_FP32", [-1], "o"),
    ("mrope_position_deltas", "TYPE_INT64", [1], "o"),
    ("lora_task_id", "TYPE_UINT64", [1], "so"),
    ("lora_weights", "TYPE_FP16", [-1, -1], "or"),
    ("lora_config", "TYPE_INT32", [-1, 3], "or"),
    ("context_phase_params", "TYPE_UINT8", [-1], "or"),
    ("skip_cross_attn_blocks", "TYPE_BOOL", [1], "or"),
    *((f"retention_token_range_{part}", "TYPE_INT32", [-1], "or")
      for part in ("starts", "ends", "priorities", "durations_ms")),
    ("retention_decode_priority", "TYPE_INT32", [1], "or"),
    ("retention_decode_duration_ms", "TYPE_INT32", [1], "or"),
    ("guided_decoding_guide_type", "TYPE_STRING", [1], "or"),
    ("guided_decoding_guide", "TYPE_STRING", [1], "or"),
    *((f"lookahead_{part}", "TYPE_INT32", [1], "or")
      for part in ("window_size", "ngram_size", "verification_set_size")),
]
OUTPUTS: list[tuple[str, str, list[int]]] = [
    ("output_ids", "TYPE_INT32", [-1, -1]), ("sequence_length", "TYPE_INT32", [-1]),
    ("cum_log_probs", "TYPE_FP32", [-1]), ("output_log_probs", "TYPE_FP32", [-1, -1]),
    ("context_logits", "${logits_datatype}", [-1, -1]),
    ("generation_logits", "${logits_datatype}", [-1, -1, -1]),
    ("batch_index", "TYPE_INT32", [1]), ("sequence_index", "TYPE_INT32", [1]),
    ("context_phase_params", "TYPE_UINT8", [-1]),
    *((f"kv_cache_{kind}_blocks", "TYPE_INT32", [1])
      for kind in ("alloc_new", "reused", "alloc_total")),
    *((f"{moment}_time_ns", "TYPE_INT64", [1])
      for moment in ("arrival", "first_scheduled", "first_token", "last_token")),
    ("acceptance_rate", "TYPE_FP32", [1]), ("total_accepted_draft_tokens", "TYPE_INT32", [1]),
    ("total_draft_tokens", "TYPE_INT32", [1]),
]
# Parameters in the template's order: each value is the placeholder of the same name, except
# these (fixed values, or placeholders named otherwise).
_PARAMETER_VALUES = {
    "FORCE_CPU_ONLY_INPUT_TENSORS": "no", "gpt_model_type": "${batching_strategy}",
    "gpt_model_path": "${engine_dir}", "encoder_model_path": "${encoder_engine_dir}",
    "executor_worker_path": "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker",
}
PARAMETERS = [
    "max_beam_width", "FORCE_CPU_ONLY_INPUT_TENSORS", "gpt_model_type", "gpt_model_path",
    "encoder_model_path", "max_tokens_in_paged_kv_cache", "max_attention_window_size",
    "sink_token_length", "batch_scheduler_policy", "kv_cache_free_gpu_mem_fraction",
    "cross_kv_cache_fraction", "kv_cache_host_memory_bytes", "kv_cache_onboard_blocks",
    "exclude_input_in_output", "cancellation_check_period_ms", "stats_check_period_ms",
    "iter_stats_max_iterations", "request_stats_max_iterations", "enable_kv_cache_reuse",
    "normalize_log_probs", "enable_chunked_context", "gpu_device_ids", "participant_ids",
    "num_nodes", "lora_cache_optimal_adapter_size", "lora_cache_max_adapter_size",
    "lora_cache_gpu_memory_fraction", "lora_cache_host_memory_bytes", "lora_prefetch_dir",
    "decoding_mode", "executor_worker_path", "lookahead_window_size", "lookahead_ngram_size",
    "lookahead_verification_set_size", "medusa_choices", "eagle_choices", "gpu_weights_percent",
    "enable_context_fmha_fp32_acc", "multi_block_mode", "cuda_graph_mode",
    "cuda_graph_cache_size", "speculative_decoding_fast_logits", "tokenizer_dir",
    "guided_decoding_backend", "xgrammar_tokenizer_info_path",
]


def stock_template() -> str:
    """The tensorrt_llm model's config.pbtxt template, placeholders and all."""
    def tensor(name: str, datatype: str, dims: list[int], flags: str = "") -> str:
        fields = [f'name: "{name}"', f"data_type: {datatype}", f"dims: {dims}"]
        fields += ["reshape: { shape: [ ] }"] * ("s" in flags)
        fields += ["allow_ragged_batch: true"] * ("r" in flags)
        fields += ["optional: true"] * ("o" in flags)
        return "  { " + " ".join(fields) + " }"

    parameters = "".join(
        f'parameters: {{ key: "{key}" value: {{ string_value: '
        f'"{_PARAMETER_VALUES.get(key, "${" + key + "}")}" }} }}\n' for key in PARAMETERS)
    return (
        'name: "tensorrt_llm"\n'
        'backend: "${triton_backend}"\n'
        "max_batch_size: ${triton_max_batch_size}\n"
        "model_transaction_policy { decoupled: ${decoupled_mode} }\n"
        "dynamic_batching {\n"
        "  preferred_batch_size: [ ${triton_max_batch_size} ]\n"
        "  max_queue_delay_microseconds: ${max_queue_delay_microseconds}\n"
        "  default_queue_policy: { max_queue_size: ${max_queue_size} }\n"
        "}\n"
        "input [\n" + ",\n".join(tensor(*spec) for spec in INPUTS) + "\n]\n"
        "output [\n" + ",\n".join(tensor(*spec) for spec in OUTPUTS) + "\n]\n"
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n" + parameters)


def fill_template(template: str, values: dict[str, str]) -> str:
    """What TensorRT-LLM's fill_template.py writes: ``values`` substituted, with its defaults
    for the queue (0, 0), every other placeholder left as it is."""
    return string.Template(template).safe_substitute(
        {"max_queue_size": "0", "max_queue_delay_microseconds": "0", **values})


def typical_values(checkpoint: pathlib.Path, decoupled: bool) -> dict[str, str]:
    """The values TensorRT-LLM's guides fill in, with the llm backend and a shoal checkpoint."""
    return {
        "triton_backend": "llm", "triton_max_batch_size": "64",
        "decoupled_mode": str(decoupled), "max_beam_width": "1",
        "engine_dir": str(checkpoint), "max_tokens_in_paged_kv_cache": "2560",
        "max_attention_window_size": "2560", "kv_cache_free_gpu_mem_fraction": "0.5",
        "exclude_input_in_output": "True", "enable_kv_cache_reuse": "False",
        "batching_strategy": "inflight_fused_batching", "max_queue_delay_microseconds": "0",
        "encoder_input_features_data_type": "TYPE_FP16", "logits_datatype": "TYPE_FP32",
    }


# what the protobuf text cannot do without (the rest may stay placeholders)
def structural_values(checkpoint: pathlib.Path) -> dict[str, str]:
    return {"triton_backend": "llm", "triton_max_batch_size": "8", "decoupled_mode": "true",
            "encoder_input_features_data_type": "TYPE_FP16", "logits_datatype": "TYPE_FP32",
            "engine_dir": str(checkpoint)}


TYPICAL_IGNORED = ["FORCE_CPU_ONLY_INPUT_TENSORS", "executor_worker_path",
                   "kv_cache_free_gpu_mem_fraction", "max_attention_window_size"]
TEMPLATE_IGNORED = ["FORCE_CPU_ONLY_INPUT_TENSORS", "executor_worker_path"]
MODELS = {"tensorrt_llm": TYPICAL_IGNORED, "tensorrt_llm_unary": TYPICAL_IGNORED,
          "tensorrt_llm_template": TEMPLATE_IGNORED}

# ------------------------------------------------------------------ the server


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A tiny random Llama, outside the model repository (TensorRT-LLM's engine_dir)."""
    path = tmp_path_factory.mktemp("engines") / "tiny-llama"
    subprocess.run([sys.executable, str(BUILD), "--output", str(path), "--vocab-size", "512",
                    "--hidden-size", "64", "--intermediate-size", "128", "--layers", "2",
                    "--heads", "4", "--kv-heads", "2", "--max-positions", "512"],
                   check=True, capture_output=True)
    return path


@pytest.fixture(scope="module")
def trtllm_server(tmp_path_factory: pytest.TempPathFactory,
                  checkpoint: pathlib.Path) -> Iterator[ShoalServer]:
    repo = tmp_path_factory.mktemp("trtllm-repo")
    template = stock_template()
    configs = {
        "tensorrt_llm": fill_template(template, typical_values(checkpoint, decoupled=True)),
        "tensorrt_llm_unary": fill_template(template, typical_values(checkpoint,
                                                                     decoupled=False)),
        "tensorrt_llm_template": fill_template(template, structural_values(checkpoint)),
    }
    for name, text in configs.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(text.replace(
            'name: "tensorrt_llm"', f'name: "{name}"'))
    server = ShoalServer([str(repo)], [f"--backend-config=llm,checkpoint-roots={checkpoint}"])
    with serving(server, timeout=180) as srv:
        yield srv


def _log(server: ShoalServer) -> str:
    return pathlib.Path(server.log_path).read_text(errors="replace")


def _tensors(module: Any, prompt: list[int], max_tokens: int,
             **extra: np.ndarray) -> list[Any]:
    arrays = {"input_ids": np.array([prompt], np.int32),
              "input_lengths": np.array([[len(prompt)]], np.int32),
              "request_output_len": np.array([[max_tokens]], np.int32), **extra}
    inputs = []
    for name, array in arrays.items():
        datatype = "BOOL" if array.dtype == np.bool_ else "INT32"
        tensor = module.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _hf_greedy(checkpoint: pathlib.Path, prompt: list[int], max_new_tokens: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    model.generation_config.eos_token_id = None  # no end id: as the tensor form without end_id
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=0)
    return list(out[0, len(prompt):].tolist())


PROMPT = [21, 64, 7, 300, 5]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def expected(checkpoint: pathlib.Path) -> list[int]:
    return _hf_greedy(checkpoint, PROMPT, MAX_TOKENS)


def _stream(server: ShoalServer, model: str, inputs: list[Any]) -> list[Any]:
    """Every response of one request over a gRPC stream, up to the final one."""
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(model, inputs)
        got = []
        while True:
            result, error = responses.get(timeout=60)
            assert error is None, error
            got.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return got
    finally:
        client.stop_stream()


# ------------------------------------------------------------------ tests


def test_each_model_logs_one_warning_naming_its_ignored_parameters(
        trtllm_server: ShoalServer) -> None:
    warnings = [line for line in _log(trtllm_server).splitlines() if " WARNING " in line]
    named = {}
    for line in warnings:
        match = re.search(r"model '(\w+)': llm backend: ignoring \d+ TensorRT-LLM "
                          r"parameter\(s\) that have no effect on this executor: (.*)$", line)
        assert match is not None, f"another warning: {line}"
        assert match.group(1) not in named, f"a second warning for {match.group(1)}"
        named[match.group(1)] = match.group(2).split(", ")
    assert named == MODELS


def test_the_stock_config_is_served_as_written(trtllm_server: ShoalServer) -> None:
    config = httpx.get(f"{trtllm_server.base}/v2/models/tensorrt_llm/config").json()
    assert config["backend"] == "llm" and config["max_batch_size"] == 64
    assert config["model_transaction_policy"] == {"decoupled": True}
    assert config["dynamic_batching"]["preferred_batch_size"] == [64]
    assert [i["name"] for i in config["input"]] == [name for name, *_ in INPUTS]
    assert [o["name"] for o in config["output"]] == [name for name, *_ in OUTPUTS]
    assert set(config["parameters"]) == set(PARAMETERS)
    assert config["parameters"]["gpt_model_path"]["string_value"].endswith("tiny-llama")


def test_decoupled_model_streams_trtllm_tensors(trtllm_server: ShoalServer,
                                                expected: list[int]) -> None:
    whole = _stream(trtllm_server, "tensorrt_llm", _tensors(grpcclient, PROMPT, MAX_TOKENS))
    assert len(whole) == 1
    assert whole[0].as_numpy("output_ids").tolist() == [[expected]]  # exclude_input_in_output
    assert whole[0].as_numpy("sequence_length").tolist() == [[MAX_TOKENS]]
    pieces = _stream(trtllm_server, "tensorrt_llm",
                     _tensors(grpcclient, PROMPT, MAX_TOKENS, streaming=np.array([[True]])))
    tokens = [int(t) for r in pieces for t in r.as_numpy("output_ids").reshape(-1)]
    assert tokens == expected


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_model_not_decoupled_answers_infer_once(trtllm_server: ShoalServer, protocol: str,
                                                expected: list[int]) -> None:
    module: Any = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(
        trtllm_server.grpc_url if protocol == "grpc" else trtllm_server.url)
    result = client.infer("tensorrt_llm_unary", _tensors(module, PROMPT, MAX_TOKENS))
    assert result.as_numpy("output_ids").tolist() == [[expected]]
    assert result.as_numpy("sequence_length").tolist() == [[MAX_TOKENS]]
    with pytest.raises(InferenceServerException, match="Streaming is only supported if model "
                                                      "is deployed using decoupled mode"):
        client.infer("tensorrt_llm_unary", _tensors(module, PROMPT, MAX_TOKENS,
                                                    streaming=np.array([[True]])))
    two = [module.InferInput("input_ids", [2, 2], "INT32"),
           module.InferInput("input_lengths", [2, 1], "INT32"),
           module.InferInput("request_output_len", [2, 1], "INT32")]
    for tensor, array in zip(two, [np.array([[5, 6], [7, 8]]), np.array([[2], [2]]),
                                   np.array([[2], [2]])], strict=True):
        tensor.set_data_from_numpy(array.astype(np.int32))
    with pytest.raises(InferenceServerException, match="Batch size > 1 requires the "
                                                      "tensorrt_llm backend to be using "
                                                      "decoupled transaction policy"):
        client.infer("tensorrt_llm_unary", two)


def test_placeholders_left_unfilled_are_not_set(trtllm_server: ShoalServer,
                                                expected: list[int]) -> None:
    """Only what the protobuf text needs was filled: every other parameter is a ``${...}``
    placeholder, read as not set (the defaults: the prompt is in the output)."""
    assert "left as ${...} placeholders are not set: batch_scheduler_policy" in \
        _log(trtllm_server)
    whole = _stream(trtllm_server, "tensorrt_llm_template",
                    _tensors(grpcclient, PROMPT, MAX_TOKENS))
    assert whole[-1].as_numpy("output_ids").tolist() == [[PROMPT + expected]]
    assert whole[-1].as_numpy("sequence_length").tolist() == [[len(PROMPT) + MAX_TOKENS]]
