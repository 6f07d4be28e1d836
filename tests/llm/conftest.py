"""Tiny random checkpoints built with transformers (fixed seed, float32) and Hugging Face
generate() as the oracle. Built once per session in a temp dir; nothing is downloaded."""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from shoal.llm import Executor, ExecutorConfig, Response
from shoal.llm.kernels import ENABLE_ENV, cpu_kernels
from shoal.llm.tiny_checkpoint import TinyLlamaSpec, build_tiny_llama

VOCAB = 128
INIT_RANGE = 0.5  # wide enough that greedy outputs vary (0.02 makes tiny models repeat one token)


def _build_llama(path: pathlib.Path) -> None:
    build_tiny_llama(path, TinyLlamaSpec(vocab_size=VOCAB, init_range=INIT_RANGE))


def _build_gpt2(path: pathlib.Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(4321)
    config = GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256,
                        initializer_range=INIT_RANGE, bos_token_id=1, eos_token_id=2)
    GPT2LMHeadModel(config).save_pretrained(path, safe_serialization=True)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    _build_llama(path)
    return path


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("tiny-gpt2")
    _build_gpt2(path)
    return path


@pytest.fixture(scope="session", params=["llama", "gpt2"])
def model_dir(request: pytest.FixtureRequest, llama_dir: pathlib.Path,
              gpt2_dir: pathlib.Path) -> pathlib.Path:
    return llama_dir if request.param == "llama" else gpt2_dir


@pytest.fixture(params=["compiled", "torch"])
def kernel_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test once with the compiled CPU kernels between the matrix products (skipped
    where they cannot be built) and once op by op in torch (SHOAL_LLM_CPU_KERNELS=0)."""
    if request.param == "torch":
        monkeypatch.setenv(ENABLE_ENV, "0")
    else:
        monkeypatch.delenv(ENABLE_ENV, raising=False)
        if cpu_kernels() is None:
            pytest.skip("the LLM CPU kernels cannot be built here (no C compiler?)")
    return str(request.param)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread while the test runs: a bitwise (or 1e-5) comparison with Hugging
    Face's forward holds only where both split their matrix products alike, and with several
    threads MKL splits by shape (seen on a 2-core AMD EPYC: 5e-6 apart with 2 threads, equal
    with 1), so the oracle would depend on the machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


_HF_MODELS: dict[pathlib.Path, Any] = {}


def hf_model(path: pathlib.Path) -> Any:
    from transformers import AutoModelForCausalLM

    if path not in _HF_MODELS:
        _HF_MODELS[path] = AutoModelForCausalLM.from_pretrained(path)  # eval mode
    return _HF_MODELS[path]


def hf_greedy(path: pathlib.Path, prompt: list[int], max_new_tokens: int,
              end_id: int | None = None) -> list[int]:
    """HF greedy continuation, with the end id (if produced) stripped as TRT-LLM does."""
    with torch.inference_mode():
        out = hf_model(path).generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens,
                                      do_sample=False, pad_token_id=0, eos_token_id=end_id)
    generated: list[int] = out[0, len(prompt):].tolist()
    if end_id is not None and end_id in generated:
        generated = generated[:generated.index(end_id)]
    return generated


def hf_beams(path: pathlib.Path, prompt: list[int], max_new_tokens: int, *, beams: int,
             returned: int, length_penalty: float, early_stopping: int,
             end_id: int | None) -> list[list[int]]:
    """HF beam search, best first; each beam's generated tokens without the end id."""
    modes: dict[int, bool | str] = {1: True, 0: False, -1: "never"}
    mode = modes[early_stopping]
    with torch.inference_mode():
        out = hf_model(path).generate(
            torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
            num_beams=beams, num_return_sequences=returned, length_penalty=length_penalty,
            early_stopping=mode, pad_token_id=0, eos_token_id=end_id,
            return_dict_in_generate=True)
    lengths = (out.beam_indices + 1).bool().sum(dim=1).tolist()
    result = []
    for row, length in zip(out.sequences.tolist(), lengths, strict=True):
        generated = row[len(prompt):len(prompt) + length]
        if end_id is not None and generated and generated[-1] == end_id:
            generated = generated[:-1]
        result.append(generated)
    return result


@pytest.fixture
def make_executor() -> Iterator[Callable[..., Executor]]:
    made: list[Executor] = []

    def make(path: pathlib.Path, config: ExecutorConfig | None = None) -> Executor:
        executor = Executor(path, config or ExecutorConfig())
        made.append(executor)
        return executor

    yield make
    for executor in made:
        executor.shutdown()


def collect(executor: Executor, ids: list[int], timeout: float = 30.0) -> dict[int, list[Response]]:
    """Every response of ``ids`` until each has its final (or error) response."""
    import time

    got: dict[int, list[Response]] = {i: [] for i in ids}
    open_ids = set(ids)
    deadline = time.monotonic() + timeout
    while open_ids:
        left = deadline - time.monotonic()
        assert left > 0, f"requests {sorted(open_ids)} did not finish in {timeout}s"
        for response in executor.await_responses(timeout=left):
            got.setdefault(response.request_id, []).append(response)
            result = response.result
            if response.has_error() or (result is not None and result.is_final):
                open_ids.discard(response.request_id)
    return got
