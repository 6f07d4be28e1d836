"""The executor on a CUDA device (skipped where torch sees none): greedy outputs of concurrent
requests equal Hugging Face ``generate`` run on the same device, and the KV pool lives there."""

from __future__ import annotations

import pathlib
import random
from collections.abc import Callable

import pytest
import torch

from shoal.llm import Executor, ExecutorConfig, Request
from tests.llm.conftest import collect, hf_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

MakeExecutor = Callable[..., Executor]


def hf_greedy_on_cuda(path: pathlib.Path, prompt: list[int], max_new_tokens: int) -> list[int]:
    model = hf_model(path).to("cuda")
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt], device="cuda"),
                             max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0,
                             eos_token_id=None)
    generated: list[int] = out[0, len(prompt):].tolist()
    return generated


def test_concurrent_greedy_on_cuda_equals_hf(llama_dir: pathlib.Path,
                                             make_executor: MakeExecutor) -> None:
    executor = make_executor(llama_dir, ExecutorConfig(device="cuda:0"))
    assert executor.kv.storage.device.type == "cuda"
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 128) for _ in range(rng.randrange(3, 40))] for _ in range(12)]
    ids = executor.enqueue_requests([Request(p, 20) for p in prompts])
    got = collect(executor, ids, timeout=120)
    for request_id, prompt in zip(ids, prompts, strict=True):
        final = got[request_id][-1]
        assert not final.has_error(), final.error_msg
        assert final.result is not None
        expected = prompt + hf_greedy_on_cuda(llama_dir, prompt, 20)  # the prompt is echoed
        assert final.result.output_token_ids[0] == expected
