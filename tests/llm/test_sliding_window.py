"""Sliding-window attention (Mistral's ``sliding_window``, Qwen2's ``use_sliding_window`` on
"sliding_attention" layers) against Hugging Face: the masks against HF's own mask function, the
model step's logits, and the executor's greedy outputs token for token (float32, CPU) with
prompts and generations longer than the window, batched, chunked and with reused prefixes."""

from __future__ import annotations

import pathlib
import random
import time
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from shoal.llm import (
    Executor,
    ExecutorConfig,
    KvCacheConfig,
    OutputConfig,
    Request,
    SamplingConfig,
)
from shoal.llm.attention import SequenceSpan, build_attention_batch, paged_attention
from shoal.llm.checkpoint import read_model_spec
from shoal.llm.kv_cache import BlockManager
from shoal.llm.models import load_model
from shoal.llm.window import layer_batches, windowed
from tests.llm.conftest import collect, hf_beams, hf_greedy, hf_model
from tests.llm.families import VOCAB, build
from tests.llm.test_checkpoint import run_prefill_then_decode

MakeExecutor = Callable[..., Executor]
WINDOW = 8
BLOCK = 4
QWEN2_LAYERS = ["sliding_attention", "full_attention", "sliding_attention"]


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return build("mistral", tmp_path_factory.mktemp("mistral-swa"), sliding_window=WINDOW)


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return build("qwen2", tmp_path_factory.mktemp("qwen2-swa"), num_hidden_layers=3,
                 use_sliding_window=True, sliding_window=WINDOW, layer_types=QWEN2_LAYERS)


@pytest.fixture(scope="module", params=["mistral", "qwen2"])
def swa_dir(request: pytest.FixtureRequest, mistral_dir: pathlib.Path,
            qwen2_dir: pathlib.Path) -> pathlib.Path:
    return mistral_dir if request.param == "mistral" else qwen2_dir


def prompt_of(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(length)]


def test_specs_carry_each_layers_window(mistral_dir: pathlib.Path,
                                        qwen2_dir: pathlib.Path) -> None:
    assert read_model_spec(mistral_dir).layer_windows == (WINDOW,) * 2
    assert read_model_spec(qwen2_dir).layer_windows == (WINDOW, None, WINDOW)
    assert hf_model(qwen2_dir).config.layer_types == QWEN2_LAYERS  # HF reads the same


@pytest.mark.parametrize("row_mask", [True, False])
def test_masks_equal_hf_sliding_window_mask(row_mask: bool) -> None:
    """One batch with a prefill span, decode rows and an extend span, each shorter and longer
    than the window: paged attention equals dense attention under HF's own mask function
    (also when the batch was built without its padding mask: the window's mask has both)."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    allowed = sliding_window_causal_mask_function(WINDOW)
    torch.manual_seed(0)
    heads, kv_heads, dim = 4, 2, 8
    blocks = BlockManager(64, BLOCK)
    layer_cache = torch.zeros(2, 64 * BLOCK, kv_heads, dim)
    # (cached, new): prefills of 5, 8, 13, 16 and 25 (0 to 4 window tiles, the last one whole
    # or not), decode rows at positions 3, 8 and 19, extends of positions [6, 9) and [10, 22)
    shapes = [(0, 5), (0, 8), (0, 13), (0, 16), (0, 25), (3, 1), (8, 1), (19, 1), (6, 3),
              (10, 12)]
    full = []
    spans = []
    start = 0
    for cached, new in shapes:
        total = cached + new
        q, k, v = (torch.randn(total, heads, dim), torch.randn(total, kv_heads, dim),
                   torch.randn(total, kv_heads, dim))
        table: list[int] = []
        if cached:
            blocks.prepare_write(table, 0, cached)
            slots = torch.tensor(blocks.slots(table, 0, cached))
            layer_cache[0, slots], layer_cache[1, slots] = k[:cached], v[:cached]
        blocks.prepare_write(table, cached, new)
        spans.append(SequenceSpan(start, new, cached, table))
        full.append((q, k, v, cached))
        start += new
    batch = windowed(build_attention_batch(spans, blocks, "cpu", row_mask=row_mask), WINDOW,
                     torch.float32)
    assert batch.decode_mask is not None and not batch.row_mask_skipped
    assert [m is None for m in batch.prefill_masks] == [True, True, False, False, False]
    query, key, value = (torch.cat([tensors[i][tensors[3]:] for tensors in full])
                         for i in range(3))
    out = paged_attention(query, key, value, layer_cache, batch, scale=0.3)
    for span, (q, k, v, cached) in zip(spans, full, strict=True):
        rows, cols = torch.arange(cached, len(q)), torch.arange(len(q))
        mask = allowed(0, 0, rows[:, None], cols[None, :])  # [queries, keys] True = attend
        expected = F.scaled_dot_product_attention(
            q[cached:].transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            attn_mask=mask, scale=0.3, enable_gqa=True)[0].transpose(0, 1)
        got = out[span.start:span.start + span.num_tokens]
        assert torch.allclose(got, expected, atol=1e-5), (cached, span.num_tokens)


def test_a_window_that_cuts_nothing_leaves_the_batch_as_it_is() -> None:
    blocks = BlockManager(16, BLOCK)
    spans = []
    for start, (cached, new) in zip((0, 8, 9), [(0, 8), (7, 1), (2, 6)], strict=True):
        table: list[int] = []
        blocks.prepare_write(table, 0, cached + new)
        spans.append(SequenceSpan(start, new, cached, table))
    batch = build_attention_batch(spans, blocks, "cpu")
    assert layer_batches(batch, [WINDOW, None, WINDOW], torch.float32) == [batch] * 3
    assert all(b is batch for b in layer_batches(batch, [WINDOW, None], torch.float32))
    cut = layer_batches(batch, [WINDOW - 1, None, WINDOW - 1], torch.float32)
    assert cut[0] is cut[2] and cut[0] is not batch and cut[1] is batch


def test_model_step_matches_hf_forward(swa_dir: pathlib.Path) -> None:
    """Prompt and decode run well past the window; logits agree to float32 noise."""
    prompt = prompt_of(1, 3 * WINDOW + 3)
    prefill, tokens, last = run_prefill_then_decode(load_model(swa_dir, "cpu"), prompt, 12)
    hf = hf_model(swa_dir)
    with torch.inference_mode():
        assert torch.allclose(prefill, hf(torch.tensor([prompt])).logits[0], atol=1e-4)
        reference = hf(torch.tensor([tokens])).logits[0, -1]
    assert torch.allclose(last, reference, atol=1e-4)


def check_greedy(executor: Executor, path: pathlib.Path,
                 cases: list[tuple[list[int], int]], stagger: bool = False) -> None:
    ids = []
    for prompt, max_tokens in cases:
        ids.append(executor.enqueue_request(Request(prompt, max_tokens)))
        if stagger:
            time.sleep(0.003)
    got = collect(executor, ids, timeout=120)
    for request_id, (prompt, max_tokens) in zip(ids, cases, strict=True):
        final = got[request_id][-1]
        assert not final.has_error(), final.error_msg
        assert final.result is not None
        assert final.result.output_token_ids == [prompt + hf_greedy(path, prompt, max_tokens)], (
            len(prompt), max_tokens)


LENGTHS = [1, 3, WINDOW - 1, WINDOW, WINDOW + 1, 2 * WINDOW + 3, 40]


def test_batched_greedy_requests_equal_hf(swa_dir: pathlib.Path,
                                          make_executor: MakeExecutor,
                                          kernel_path: str) -> None:
    """Prompts shorter than, as long as and longer than the window, generating past it, in
    iterations that mix prefills and decode rows of different lengths."""
    cases = [(prompt_of(10 + i, n), 2 * WINDOW + i) for i, n in enumerate(LENGTHS)]
    config = ExecutorConfig(max_batch_size=4, kv_cache_config=KvCacheConfig(
        tokens_per_block=BLOCK, enable_block_reuse=False))
    check_greedy(make_executor(swa_dir, config), swa_dir, cases, stagger=True)


def test_chunked_context_and_prefix_reuse_equal_hf(swa_dir: pathlib.Path,
                                                   make_executor: MakeExecutor) -> None:
    """Chunks of 12 tokens (extend spans past the window) beside generating rows, then prompts
    whose first blocks are reused from the earlier ones."""
    config = ExecutorConfig(max_batch_size=4, max_num_tokens=12, enable_chunked_context=True,
                            kv_cache_config=KvCacheConfig(tokens_per_block=BLOCK,
                                                          enable_block_reuse=True))
    executor = make_executor(swa_dir, config)
    first = [(prompt_of(30 + i, n), WINDOW + 5) for i, n in enumerate((5, 29, 47))]
    check_greedy(executor, swa_dir, first)
    reused = [(first[1][0][:20] + prompt_of(40, 9), 12),  # 5 shared blocks
              (first[2][0], 2 * WINDOW),  # all of it shared
              (first[2][0][:44] + prompt_of(41, 2), 10)]
    check_greedy(executor, swa_dir, reused)
    assert executor.get_latest_iteration_stats()[-1].kv_cache_stats.reused_blocks >= 5


def test_beam_search_equals_hf(swa_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    """Beams fork and copy blocks past the window; each beam equals HF's."""
    cases = [(prompt_of(70, 6), 3), (prompt_of(71, 2 * WINDOW + 1), 2)]
    executor = make_executor(swa_dir, ExecutorConfig(
        max_beam_width=3, max_batch_size=2,
        kv_cache_config=KvCacheConfig(tokens_per_block=BLOCK)))
    ids = executor.enqueue_requests([
        Request(prompt, 2 * WINDOW, sampling_config=SamplingConfig(
            width, length_penalty=1.0, num_return_sequences=width),
            output_config=OutputConfig(exclude_input_from_output=True))
        for prompt, width in cases])
    got = collect(executor, ids, timeout=120)
    for request_id, (prompt, width) in zip(ids, cases, strict=True):
        result = got[request_id][-1].result
        assert result is not None
        assert result.output_token_ids == hf_beams(
            swa_dir, prompt, 2 * WINDOW, beams=width, returned=width, length_penalty=1.0,
            early_stopping=1, end_id=None), width


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_greedy_on_cuda_equals_hf_on_cuda(swa_dir: pathlib.Path,
                                          make_executor: MakeExecutor) -> None:
    """The windowed masks on the device (float32, chunked context, reused prefixes) against
    Hugging Face run on the same device."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(swa_dir).to("cuda")  # not the shared CPU copy
    config = ExecutorConfig(device="cuda:0", max_batch_size=4, max_num_tokens=12,
                            enable_chunked_context=True,
                            kv_cache_config=KvCacheConfig(tokens_per_block=BLOCK))
    executor = make_executor(swa_dir, config)
    assert executor.kv.storage.device.type == "cuda"
    prompts = [prompt_of(50 + i, n) for i, n in enumerate(LENGTHS)]
    prompts.append(prompts[-1][:36] + prompt_of(60, 7))  # shares 9 blocks with the last
    ids = executor.enqueue_requests([Request(p, 2 * WINDOW) for p in prompts])
    got = collect(executor, ids, timeout=120)
    for request_id, prompt in zip(ids, prompts, strict=True):
        final = got[request_id][-1]
        assert not final.has_error(), final.error_msg
        assert final.result is not None
        with torch.inference_mode():
            out = hf.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=2 * WINDOW,
                              do_sample=False, pad_token_id=0, eos_token_id=None)
        assert final.result.output_token_ids == [out[0].tolist()], len(prompt)
