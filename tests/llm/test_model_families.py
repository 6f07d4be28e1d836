"""The Llama relatives — Llama 3 rope scaling, Qwen2 (q/k/v biases, tied embeddings), Qwen3
(QK-norm) and Mistral — against Hugging Face: the model step's logits, and the executor's
greedy and beam-search outputs token for token (float32, CPU). Sliding windows are tested in
test_sliding_window.py; here, which layers of a config get one."""

from __future__ import annotations

import json
import pathlib
import random
import time
from collections.abc import Callable

import pytest
import torch

from shoal.errors import ShoalError
from shoal.llm import Executor, ExecutorConfig, OutputConfig, Request, SamplingConfig
from shoal.llm.checkpoint import Llama3RopeScaling, read_model_spec
from shoal.llm.models import load_model
from shoal.llm.models.rope import llama3_inverse_frequencies
from tests.llm.conftest import collect, hf_beams, hf_greedy, hf_model
from tests.llm.families import LLAMA3_ROPE, VOCAB, build
from tests.llm.test_checkpoint import run_prefill_then_decode

MakeExecutor = Callable[..., Executor]
FAMILIES = ["llama3", "qwen2", "qwen3", "mistral"]


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    family: str = request.param
    return build(family, tmp_path_factory.mktemp(f"tiny-{family}"))


def random_prompt(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(rng.randrange(low, high + 1))]


def edit_config(path: pathlib.Path, **changes: object) -> pathlib.Path:
    """Apply ``changes`` to config.json; a None value removes the key."""
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    config = {key: value for key, value in config.items() if value is not None}
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_llama3_inverse_frequencies_equal_hf() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16,
                         max_position_embeddings=256, rope_parameters=dict(LLAMA3_ROPE))
    expected, attention_factor = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    scaling = Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                original_max_position_embeddings=64)
    ours = llama3_inverse_frequencies(16, 10000.0, scaling)
    assert torch.equal(ours, expected) and attention_factor == 1.0
    default = 1.0 / (10000.0 ** (torch.arange(0, 16, 2).float() / 16))
    kept, divided = ours == default, ours == default / 8.0
    interpolated = ~kept & ~divided
    assert kept.any() and interpolated.any() and divided.any()  # all three bands exercised


def test_family_specs(tmp_path: pathlib.Path) -> None:
    specs = {family: read_model_spec(build(family, tmp_path / family)) for family in FAMILIES}
    switches = {family: (spec.architecture, spec.qkv_bias, spec.out_proj_bias, spec.qk_norm,
                         spec.tie_word_embeddings) for family, spec in specs.items()}
    assert switches == {"llama3": ("llama", False, False, False, False),
                        "qwen2": ("qwen2", True, False, False, True),
                        "qwen3": ("qwen3", False, False, True, False),
                        "mistral": ("mistral", False, False, False, False)}
    assert specs["llama3"].rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 64)
    assert all(specs[f].rope_scaling is None for f in ("qwen2", "qwen3", "mistral"))


def test_transformers_4_rope_scaling_format_is_read(tmp_path: pathlib.Path) -> None:
    """Llama 3.1 checkpoints saved before transformers 5 keep rope_theta beside rope_scaling."""
    path = build("llama3", tmp_path / "m")
    legacy = {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"}
    edit_config(path, rope_parameters=None, rope_scaling=legacy, rope_theta=500000.0)
    spec = read_model_spec(path)
    assert spec.rope_theta == 500000.0
    assert spec.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 64)


def test_model_step_matches_hf_forward(family_dir: pathlib.Path, kernel_path: str) -> None:
    """Context logits are bitwise equal op by op (float32 noise apart with the compiled
    kernels); decode logits (paged keys) agree to float32 noise. The prompt and decode run
    past original_max_position_embeddings (64)."""
    prompt = random_prompt(random.Random(1), 70, 70)
    prefill, tokens, last = run_prefill_then_decode(load_model(family_dir, "cpu"), prompt, 9)
    hf = hf_model(family_dir)
    with torch.inference_mode():
        context = hf(torch.tensor([prompt])).logits[0]
        if kernel_path == "torch":
            assert torch.equal(prefill, context)
        else:
            assert torch.allclose(prefill, context, rtol=1e-4, atol=1e-4)
        reference = hf(torch.tensor([tokens])).logits[0, -1]
    assert torch.allclose(last, reference, atol=1e-4)


def test_staggered_greedy_requests_equal_hf(family_dir: pathlib.Path,
                                            make_executor: MakeExecutor,
                                            kernel_path: str) -> None:
    rng = random.Random(6)
    cases = [(random_prompt(rng, 1, 60), rng.randrange(1, 40)) for _ in range(8)]
    executor = make_executor(family_dir, ExecutorConfig(max_batch_size=4))
    ids = []
    for index, (prompt, max_tokens) in enumerate(cases):
        ids.append(executor.enqueue_request(Request(prompt, max_tokens,
                                                    streaming=index % 2 == 1)))
        time.sleep(0.003)
    got = collect(executor, ids)
    for index, (request_id, (prompt, max_tokens)) in enumerate(zip(ids, cases, strict=True)):
        assert not got[request_id][-1].has_error(), got[request_id][-1].error_msg
        tokens = [t for r in got[request_id] if r.result is not None
                  for t in r.result.output_token_ids[0]]
        expected = hf_greedy(family_dir, prompt, max_tokens)
        assert tokens == (expected if index % 2 == 1 else prompt + expected), index


def test_beam_search_equals_hf(family_dir: pathlib.Path, make_executor: MakeExecutor) -> None:
    rng = random.Random(4)
    cases = []
    for width, length_penalty, early_stopping in ((2, 1.0, 1), (3, 0.5, 0)):
        prompt, max_tokens = random_prompt(rng, 2, 12), rng.randrange(6, 14)
        free_run = hf_beams(family_dir, prompt, max_tokens, beams=width, returned=1,
                            length_penalty=length_penalty, early_stopping=early_stopping,
                            end_id=None)[0]
        cases.append((prompt, max_tokens, width, length_penalty, early_stopping, free_run[2]))
    executor = make_executor(family_dir, ExecutorConfig(max_beam_width=3, max_batch_size=2))
    ids = executor.enqueue_requests([
        Request(prompt, max_tokens, end_id=end_id,
                sampling_config=SamplingConfig(width, length_penalty=lp, early_stopping=es,
                                               num_return_sequences=width),
                output_config=OutputConfig(exclude_input_from_output=True))
        for prompt, max_tokens, width, lp, es, end_id in cases])
    got = collect(executor, ids)
    for request_id, (prompt, max_tokens, width, lp, es, end_id) in zip(ids, cases, strict=True):
        result = got[request_id][-1].result
        assert result is not None
        assert result.output_token_ids == hf_beams(
            family_dir, prompt, max_tokens, beams=width, returned=width, length_penalty=lp,
            early_stopping=es, end_id=end_id), (width, lp, es)


@pytest.mark.parametrize(("family", "changes"), [
    ("mistral", {"sliding_window": 16}),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 16,
               "layer_types": ["full_attention", "sliding_attention"]}),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1,
               "layer_types": None}),  # layers from max_window_layers on slide
])
def test_sliding_window_shorter_than_context_loads(tmp_path: pathlib.Path, family: str,
                                                   changes: dict[str, object]) -> None:
    """Refused before the window mask existed; now each sliding layer gets the window."""
    path = edit_config(build(family, tmp_path / family), **changes)
    model = load_model(path, "cpu")
    expected = {"mistral": (16, 16), "qwen2": (None, 16), "qwen3": (None, 16)}[family]
    assert model.spec.layer_windows == expected
    if family != "mistral":  # HF reads the same layer types (Mistral has none: all slide)
        config = hf_model(path).config
        assert [w is not None for w in expected] == [
            kind == "sliding_attention" for kind in config.layer_types]


@pytest.mark.parametrize(("family", "changes", "windows"), [
    ("mistral", {"sliding_window": 256}, (256, 256)),  # covers the context: never cuts
    ("qwen2", {"use_sliding_window": False, "sliding_window": 16}, ()),  # HF ignores it
    ("qwen3", {"use_sliding_window": True, "sliding_window": 16,
               "layer_types": ["full_attention", "full_attention"]}, ()),  # no sliding layer
    ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "layer_types": None,
               "max_window_layers": None}, ()),  # max_window_layers 28 (HF's default) >= 2
])
def test_windows_that_never_apply_load(tmp_path: pathlib.Path, family: str,
                                       changes: dict[str, object],
                                       windows: tuple[int, ...]) -> None:
    path = edit_config(build(family, tmp_path / family), **changes)
    spec = load_model(path, "cpu").spec
    assert spec.architecture == family and spec.layer_windows == windows


def test_unsupported_rope_settings_are_named(tmp_path: pathlib.Path) -> None:
    path = build("llama3", tmp_path / "m")
    edit_config(path, rope_parameters=LLAMA3_ROPE | {"partial_rotary_factor": 0.5})
    with pytest.raises(ShoalError, match="partial_rotary_factor"):
        read_model_spec(path)
    edit_config(path, rope_parameters=LLAMA3_ROPE | {"rope_type": "dynamic"})
    with pytest.raises(ShoalError, match=r"rope_type 'dynamic' is not supported \(supported: "
                                         r"default, llama3\)"):
        read_model_spec(path)


def test_compiled_iteration_equals_the_layer_by_layer_path(
        family_dir: pathlib.Path, make_executor: MakeExecutor,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole iterations in one compiled call (context spans and decode rows, staggered so they
    mix; Llama 3: untied, no biases; Qwen2: q/k/v biases, tied embeddings; Mistral) give the
    same tokens and, to float32 noise, the same log-probabilities as the layer-by-layer path;
    Qwen3's QK-norm keeps the latter."""
    from shoal.llm.kernels import CpuKernels, cpu_kernels
    from shoal.llm.models.llama import LlamaModel

    kernels = cpu_kernels()
    if kernels is None or kernels.sgemm is None:
        pytest.skip("no compiled kernels or BLAS sgemm here")
    calls = {"n": 0}
    original = CpuKernels.llama_step

    def counted(self: CpuKernels, *args: object, **kwargs: object) -> torch.Tensor:
        calls["n"] += 1
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(CpuKernels, "llama_step", counted)
    rng = random.Random(9)
    cases = [(random_prompt(rng, 5, 40), rng.randrange(8, 30)) for _ in range(6)]

    def run() -> list[tuple[list[int], list[float]]]:
        executor = make_executor(family_dir, ExecutorConfig(max_batch_size=4))
        ids = [executor.enqueue_request(Request(prompt, max_tokens, output_config=OutputConfig(
            return_log_probs=True))) for prompt, max_tokens in cases]
        got = collect(executor, ids)
        out = []
        for request_id in ids:
            (response,) = got[request_id]
            assert response.result is not None and response.result.log_probs is not None
            out.append((response.result.output_token_ids[0], response.result.log_probs[0]))
        return out

    compiled = run()
    assert (calls["n"] > 0) == (not read_model_spec(family_dir).qk_norm)
    monkeypatch.setattr(LlamaModel, "_compiled_iteration", lambda self: (None, []))
    layered = run()
    for (tokens, log_probs), (expected_tokens, expected_log_probs) in zip(
            compiled, layered, strict=True):
        assert tokens == expected_tokens
        assert log_probs == pytest.approx(expected_log_probs, abs=1e-4)
