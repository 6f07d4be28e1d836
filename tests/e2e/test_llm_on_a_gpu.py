"""The ``llm`` backend on a KIND_GPU instance (skipped where torch sees no CUDA device): the KV
pool is sized from free device memory (``kv_cache_free_gpu_mem_fraction``), the executor runs
on ``cuda:0``, and greedy text through ``generate`` equals Hugging Face ``generate`` on the
same device."""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

from tests.e2e.conftest import serving
from tests.e2e.server import ShoalServer
from tests.e2e.test_llm_serving import build_llm_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

EOS = 2


@pytest.fixture(scope="module")
def gpu_llm_repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    repo = tmp_path_factory.mktemp("llm-gpu-repo")
    config = build_llm_model(repo, 2048)
    config, sized = re.subn(
        r'"max_tokens_in_paged_kv_cache" value: \{ string_value: "\d+" \}',
        '"kv_cache_free_gpu_mem_fraction" value: { string_value: "0.01" }', config)
    config, placed = re.subn(r"kind: KIND_CPU", "kind: KIND_GPU gpus: [ 0 ]", config)
    assert sized == 1 and placed == 1
    (repo / "llm" / "config.pbtxt").write_text(config)
    return repo


@pytest.fixture(scope="module")
def gpu_llm_server(gpu_llm_repo: pathlib.Path) -> Iterator[ShoalServer]:
    with serving(ShoalServer([str(gpu_llm_repo)])) as srv:
        yield srv


def hf_greedy_text(checkpoint: pathlib.Path, prompt: str, max_new_tokens: int) -> str:
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    model: Any = AutoModelForCausalLM.from_pretrained(checkpoint).to("cuda")
    ids = tokenizer.encode(prompt).ids
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=0, eos_token_id=EOS)
    generated: list[int] = out[0, len(ids):].tolist()
    if EOS in generated:
        generated = generated[:generated.index(EOS)]
    text: str = tokenizer.decode(generated)
    return text


def test_generate_on_a_gpu_instance_equals_hf(gpu_llm_server: ShoalServer,
                                              gpu_llm_repo: pathlib.Path) -> None:
    for prompt in ["Hello world", "Café au lait 日本語", "The quick brown fox"]:
        r = httpx.post(f"{gpu_llm_server.base}/v2/models/llm/generate",
                       json={"text_input": prompt, "max_tokens": 16}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["text_output"] == hf_greedy_text(gpu_llm_repo / "llm" / "checkpoint",
                                                         prompt, 16)
    log = gpu_llm_server.log()
    assert re.search(r"LLM executor ready: .* on cuda:0", log), log[-2000:]


def test_gpu_gauges_count_the_llm_instance(gpu_llm_server: ShoalServer) -> None:
    """NVML gauges in Triton's names, one series per device, with the instance's memory."""
    pytest.importorskip("pynvml")
    text = httpx.get(f"http://127.0.0.1:{gpu_llm_server.metrics_port}/metrics", timeout=10).text
    used = re.findall(r'^nv_gpu_memory_used_bytes\{gpu_uuid="GPU-[^"]+"\} (\S+)$', text, re.M)
    total = re.findall(r'^nv_gpu_memory_total_bytes\{gpu_uuid="GPU-[^"]+"\} (\S+)$', text, re.M)
    assert used and total, text[-3000:]
    assert 0 < float(used[0]) < float(total[0])
