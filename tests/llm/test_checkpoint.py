"""Checkpoint loading and the model step against Hugging Face's forward pass."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest
import torch

from shoal.errors import ErrorCode, ShoalError
from shoal.llm.attention import SequenceSpan, build_attention_batch
from shoal.llm.checkpoint import load_tokenizer, read_model_spec
from shoal.llm.kv_cache import BlockManager, KvCachePool
from shoal.llm.models import CausalLM, load_model
from tests.llm.conftest import hf_model


def test_llama_spec(llama_dir: pathlib.Path) -> None:
    spec = read_model_spec(llama_dir)
    assert (spec.architecture, spec.num_layers, spec.num_heads, spec.num_kv_heads,
            spec.head_dim, spec.vocab_size) == ("llama", 2, 4, 2, 16, 128)
    assert spec.rope_theta == 10000.0 and spec.attention_scale == pytest.approx(0.25)


def test_gpt2_spec(gpt2_dir: pathlib.Path) -> None:
    spec = read_model_spec(gpt2_dir)
    assert (spec.architecture, spec.hidden_size, spec.intermediate_size,
            spec.max_position_embeddings, spec.tie_word_embeddings) == ("gpt2", 64, 256, 256, True)


def edited_copy(source: pathlib.Path, target: pathlib.Path, **changes: object) -> pathlib.Path:
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config.update(changes)
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize(("changes", "code", "message"), [
    ({"model_type": "bert"}, ErrorCode.UNSUPPORTED, "model_type 'bert' is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, ErrorCode.UNSUPPORTED,
     "rope_type 'yarn'"),
    ({"hidden_act": "mish"}, ErrorCode.UNSUPPORTED, "activation 'mish'"),
])
def test_unsupported_configs_are_named(llama_dir: pathlib.Path, tmp_path: pathlib.Path,
                                       changes: dict[str, object], code: ErrorCode,
                                       message: str) -> None:
    path = edited_copy(llama_dir, tmp_path / "m", **changes)
    with pytest.raises(ShoalError) as raised:
        load_model(path, "cpu")
    assert raised.value.code is code and message in raised.value.message


def test_missing_files_and_tensors(llama_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    with pytest.raises(ShoalError, match=r"no config\.json"):
        read_model_spec(tmp_path)
    path = edited_copy(llama_dir, tmp_path / "m", num_hidden_layers=3)
    with pytest.raises(ShoalError, match=r"lacks tensor 'model\.layers\.2"):
        load_model(path, "cpu")
    for weights in path.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(ShoalError, match=r"no \*\.safetensors"):
        load_model(path, "cpu")
    assert load_tokenizer(tmp_path) is None


def run_prefill_then_decode(model: CausalLM, prompt: list[int],
                            steps: int) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    spec = model.spec
    blocks = BlockManager(32, 4)
    pool = KvCachePool.allocate(num_layers=spec.num_layers, num_kv_heads=spec.num_kv_heads,
                                head_dim=spec.head_dim, num_blocks=32, tokens_per_block=4,
                                dtype=torch.float32, device="cpu")
    table: list[int] = []
    blocks.prepare_write(table, 0, len(prompt))
    batch = build_attention_batch([SequenceSpan(0, len(prompt), 0, table)], blocks, "cpu")
    with torch.inference_mode():
        prefill = model.forward(torch.tensor(prompt), torch.arange(len(prompt)), batch, pool,
                                torch.arange(len(prompt)))
        tokens, logits = list(prompt), prefill[-1:]
        for _ in range(steps):
            tokens.append(int(logits[-1].argmax()))
            position = len(tokens) - 1
            blocks.prepare_write(table, position, 1)
            batch = build_attention_batch([SequenceSpan(0, 1, position, table)], blocks, "cpu")
            logits = model.forward(torch.tensor(tokens[-1:]), torch.tensor([position]), batch,
                                   pool, torch.tensor([0]))
    return prefill, tokens, logits[0]


@pytest.mark.usefixtures("one_torch_thread")
def test_model_step_matches_hf_forward(model_dir: pathlib.Path, kernel_path: str) -> None:
    """Context logits are bitwise equal op by op (float32 noise apart with the compiled
    kernels, whose reductions run in another order); decode logits (paged keys) agree to
    float32 noise."""
    prompt = [3, 14, 15, 92, 65, 35, 89, 79, 32]
    prefill, tokens, last = run_prefill_then_decode(load_model(model_dir, "cpu"), prompt, 9)
    hf = hf_model(model_dir)
    with torch.inference_mode():
        context = hf(torch.tensor([prompt])).logits[0]
        if kernel_path == "torch" or model_dir.name.startswith("tiny-gpt2"):
            assert torch.equal(prefill, context)
        else:
            assert torch.allclose(prefill, context, rtol=1e-4, atol=1e-4)
        reference = hf(torch.tensor([tokens])).logits[0, -1]
    assert torch.allclose(last, reference, atol=1e-4)
